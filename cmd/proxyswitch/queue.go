package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/proxyswitch/proxyswitch/storage"
)

// maxDeadShown bounds "queue NS dead N".
const maxDeadShown = 10_000

// queue runs "queue NS [stats | dead [N] | requeue ID...]" on the request
// queue of storage namespace NS.
func (a *app) queue(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: queue takes a storage NAMESPACE, then stats (the default), dead [N] or requeue ID...", errUsage)
	}
	s, err := a.newStorage(args[0])
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	sub, rest := "stats", args[1:]
	if len(rest) > 0 {
		sub, rest = rest[0], rest[1:]
	}
	switch sub {
	case "stats":
		if len(rest) != 0 {
			return fmt.Errorf("%w: queue NS stats takes no arguments", errUsage)
		}
		st, err := s.Stats(ctx)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.out, "ready %d, in flight %d, dead %d\n", st.Ready, st.InFlight, st.Dead)
		return err
	case "dead":
		n := 20
		if len(rest) > 1 {
			return fmt.Errorf("%w: queue NS dead takes at most a count N", errUsage)
		}
		if len(rest) == 1 {
			if n, err = strconv.Atoi(rest[0]); err != nil || n < 1 || n > maxDeadShown {
				return fmt.Errorf("%w: queue NS dead %q: want a count from 1 to %d", errUsage, rest[0], maxDeadShown)
			}
		}
		return a.deadLetters(ctx, s, n)
	case "requeue":
		if len(rest) == 0 {
			return fmt.Errorf("%w: queue NS requeue takes dead-letter IDs (queue NS dead lists them)", errUsage)
		}
		for _, id := range rest {
			if err := s.Requeue(ctx, id); err != nil {
				if errors.Is(err, storage.ErrNotFound) {
					return fmt.Errorf("requeue: %q is not a dead letter of namespace %q", id, args[0])
				}
				return err
			}
			if _, err := fmt.Fprintf(a.out, "requeued %s\n", id); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("%w: queue NS %q: want stats, dead [N] or requeue ID...", errUsage, sub)
}

// deadLetters prints the oldest n dead letters: ID, URL (password
// redacted), deliveries, since when, why.
func (a *app) deadLetters(ctx context.Context, s *storage.Storage, n int) error {
	dead, err := s.DeadLetters(ctx, 0, n)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tURL\tDELIVERIES\tSINCE\tREASON")
	for _, d := range dead {
		u := "(unreadable request)"
		if d.URL != "" {
			u = redactStored(d.URL)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", d.ID, u, d.Deliveries, d.Since.UTC().Format(time.RFC3339), d.Reason)
	}
	return tw.Flush()
}
