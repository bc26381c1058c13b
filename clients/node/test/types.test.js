// The hand-written declarations (index.d.ts) compile against a usage file.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

test('index.d.ts: tsc --noEmit on test/types/usage.ts', () => {
  const dir = fileURLToPath(new URL('./types/', import.meta.url));
  const tsc = fileURLToPath(new URL('../node_modules/typescript/bin/tsc', import.meta.url));
  try {
    execFileSync(process.execPath, [tsc, '-p', dir], { encoding: 'utf8' });
  } catch (e) {
    assert.fail(`tsc failed:\n${e.stdout}${e.stderr}`);
  }
});
