// Package cluster lets several gateways share device windows and quota
// overrides in Redis, so that a device's quota holds whichever gateway
// it connects to.
//
// Limiter decides like devicelimit.Table, but on a window kept in Redis
// and updated by a Lua script (see windowLua), on Redis's clock. A
// script call runs atomically; decisions that arrive together go in one
// call to a single server, or in one pipeline of calls to Redis Cluster. When Redis is unreachable or slower than the timeout, a
// failure policy decides instead (Policy), and Redis is tried again
// after a short pause: recovery needs nothing from the operator.
//
// Overrides keeps runtime quota overrides in one Redis hash and tells
// every gateway of a change over pub/sub; each gateway mirrors the hash
// in its own devicelimit.Resolver, so the publish path never waits for
// an override lookup.
//
// Deferred messages stay in each gateway's own store; only their release
// decisions go through the Limiter.
package cluster
