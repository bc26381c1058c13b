/* A floor of RL.CONCURRENCY's own shape, for bench/profile.py.
 *
 * FLOOR.LEASE key limit lease_ms action id -> what FLOOR.WRITE (the shared
 * floor, ../shared/floor/floor.c) does, for a request of RL.CONCURRENCY's
 * six arguments: read two numbers, the action and the id (pointer and
 * length), open the key for writing, keep a 16-byte module value, set a
 * relative expiry of lease_ms, ReplicateVerbatim, reply five integers.
 * The server parses two more arguments than FLOOR.WRITE's (one a 36-byte
 * id), and the command reads them: costs of the request's shape, not of
 * the module, which this floor pays too. It keeps no lease and hashes
 * nothing: the least such a command does.
 *
 * Build: gcc -O2 -shared -fPIC -I<dir of redismodule.h> lease.c -o lease.so */
#define REDISMODULE_EXPERIMENTAL_API
#include "redismodule.h"

static RedisModuleType *LeaseType;

typedef struct {
    long long at, left;
} Held;

static void *held_load(RedisModuleIO *io, int encver) {
    (void)encver;
    Held *h = RedisModule_Alloc(sizeof *h);
    h->at = RedisModule_LoadSigned(io);
    h->left = RedisModule_LoadSigned(io);
    return h;
}

static void held_save(RedisModuleIO *io, void *value) {
    Held *h = value;
    RedisModule_SaveSigned(io, h->at);
    RedisModule_SaveSigned(io, h->left);
}

static void held_free(void *value) { RedisModule_Free(value); }

static int Lease(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    long long limit, lease_ms;
    size_t alen, ilen;
    if (argc != 6 || RedisModule_StringToLongLong(argv[2], &limit) != REDISMODULE_OK ||
        RedisModule_StringToLongLong(argv[3], &lease_ms) != REDISMODULE_OK)
        return RedisModule_WrongArity(ctx);
    const char *action = RedisModule_StringPtrLen(argv[4], &alen);
    const char *id = RedisModule_StringPtrLen(argv[5], &ilen);
    if (alen == 0 || (ilen > 0 && id == NULL) || action == NULL) return RedisModule_WrongArity(ctx);
    RedisModuleKey *k = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    long long now = RedisModule_Milliseconds();
    if (RedisModule_KeyType(k) == REDISMODULE_KEYTYPE_EMPTY) {
        Held *h = RedisModule_Alloc(sizeof *h);
        h->at = now;
        h->left = limit - 1;
        RedisModule_ModuleTypeSetValue(k, LeaseType, h);
    } else if (RedisModule_ModuleTypeGetType(k) == LeaseType) {
        Held *h = RedisModule_ModuleTypeGetValue(k);
        h->at = now;
    } else {
        RedisModule_CloseKey(k);
        return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    }
    RedisModule_SetExpire(k, lease_ms);
    RedisModule_CloseKey(k);
    RedisModule_ReplicateVerbatim(ctx);
    RedisModule_ReplyWithArray(ctx, 5);
    RedisModule_ReplyWithLongLong(ctx, 1);
    RedisModule_ReplyWithLongLong(ctx, limit);
    RedisModule_ReplyWithLongLong(ctx, limit - 1);
    RedisModule_ReplyWithLongLong(ctx, 0);
    RedisModule_ReplyWithLongLong(ctx, lease_ms);
    return REDISMODULE_OK;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (RedisModule_Init(ctx, "floorlease", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    RedisModuleTypeMethods tm = {.version = REDISMODULE_TYPE_METHOD_VERSION,
                                 .rdb_load = held_load,
                                 .rdb_save = held_save,
                                 .free = held_free};
    LeaseType = RedisModule_CreateDataType(ctx, "flo-lease", 0, &tm);
    if (LeaseType == NULL) return REDISMODULE_ERR;
    return RedisModule_CreateCommand(ctx, "FLOOR.LEASE", Lease, "write deny-oom fast", 1, 1, 1);
}
