package proxyswitchtest

import "github.com/alicebob/miniredis/v2"

// ExpireEvery is expireEvery, for scripts_test.go.
const ExpireEvery = expireEvery

// Miniredis returns the embedded server of s, or nil.
func Miniredis(s *Redis) *miniredis.Miniredis { return s.embed }
