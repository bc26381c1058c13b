// Reserve then settle: take an estimate before the work, then give back
// what it did not use (REFUND) or take what it used beyond the estimate
// (COST n FORCE, a debit past the limit), exactly once. See
// clients/DESIGN.md, "Reservations: reserve and settle".
import { checkInt } from './policy.js';

/** What Limiter.reserve returns; await settle(actual) once. */
export class Reservation {
  constructor(limiter, key, estimate, decision) {
    this.limiter = limiter;
    this.key = key;
    this.estimate = estimate;
    /** the decision on limit(key, {cost: estimate}) */
    this.decision = decision;
    /** settle() was called (whatever its call's outcome) */
    this.settled = false;
  }

  get allowed() { return this.decision.allowed; }

  /**
   * REFUND (estimate - actual), or COST (actual - estimate) FORCE, or
   * nothing: that call's Decision, null when nothing was sent. Once: a
   * second settle throws and sends nothing.
   */
  async settle(actual) {
    checkInt('actual', actual, 0);
    if (this.settled) throw new Error('this reservation is settled already (settle sends once)');
    this.settled = true; // before the call: whatever its outcome, never twice
    const d = this.decision;
    if (!d.allowed || d.source === 'panic' || d.source === 'local') return null; // nothing was taken on Redis
    const diff = actual - this.estimate;
    if (diff < 0) return this.limiter.refund(this.key, -diff);
    if (diff > 0) return this.limiter.debit(this.key, diff);
    return null;
  }
}
