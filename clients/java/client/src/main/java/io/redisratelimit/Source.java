package io.redisratelimit;

/** Where a decision came from: the module, the Lua twins, a leased limiter's reservoir, or the panic limits. */
public enum Source {
    MODULE, LUA, LOCAL, PANIC;

    /** "module", "lua", "local", "panic" (as every client names them). */
    @Override
    public String toString() {
        return name().toLowerCase();
    }
}
