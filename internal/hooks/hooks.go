// Package hooks lets the module's own packages reach what the root
// package keeps unexported, so that the root's API stays small.
package hooks

import "github.com/redis/go-redis/v9"

// Prefix returns the key prefix (WithPrefix) of sw, a *proxyswitch.Switch.
// Package proxyswitch sets it in its init.
var Prefix func(sw any) string

// Redis returns the Redis client of sw, a *proxyswitch.Switch (the one
// given to NewSwitch). Package proxyswitch sets it in its init.
var Redis func(sw any) redis.Scripter

// Observers returns the observers set on sw, a *proxyswitch.Switch, by
// SetObserver, each as it was given (none: nil), so that a package of the
// module can hand them events of an optional interface of its own.
// Package proxyswitch sets it in its init.
var Observers func(sw any) []any
