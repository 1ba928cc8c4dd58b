package probe

import (
	"context"
	"fmt"

	"github.com/proxyswitch/proxyswitch"
)

// LockHeld reports whether a Checker's Run, in any process (this Checker's
// included), holds the pool's probe lock now: one read of Redis (Redis
// required: ErrConfig without), which changes nothing. Check does not take
// the lock, so a one-shot Check runs beside a Run that holds it; a tool may
// call LockHeld first to say so. The answer may be stale as soon as it
// returns (a holder may stop, another take over). It is safe for
// concurrent use.
func (c *Checker) LockHeld(ctx context.Context) (bool, error) {
	if c.Redis == nil {
		return false, fmt.Errorf("%w: probe: LockHeld needs Redis", proxyswitch.ErrConfig)
	}
	key, err := c.leaderKey()
	if err != nil {
		return false, err
	}
	n, err := leaderScript.Run(ctx, c.Redis, []string{key}, "held", "", 0).Int64()
	if err != nil {
		return false, fmt.Errorf("probe: reading the probe lock of pool %q: %w", c.Switch.Pool(), err)
	}
	return n == 1, nil
}
