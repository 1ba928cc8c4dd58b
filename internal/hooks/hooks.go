// Package hooks lets the module's own packages reach what the root
// package keeps unexported, so that the root's API stays small.
package hooks

// Prefix returns the key prefix (WithPrefix) of sw, a *proxyswitch.Switch.
// Package proxyswitch sets it in its init.
var Prefix func(sw any) string
