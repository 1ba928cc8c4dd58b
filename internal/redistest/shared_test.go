package redistest

import (
	"strings"
	"testing"
	"time"
)

func TestStartSharedFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env     string
		cluster bool
	}{{"", false}, {"single", false}, {"cluster", true}} {
		t.Run("env="+tc.env, func(t *testing.T) {
			t.Setenv(SharedEnv, tc.env)
			s, err := StartSharedFromEnv()
			if err != nil {
				t.Fatalf("StartSharedFromEnv: %v", err)
			}
			defer s.Close()
			if got := s.Cluster != nil; got != tc.cluster || (s.Server == nil) != tc.cluster {
				t.Fatalf("Server %v, Cluster %v; want a cluster: %v", s.Server, s.Cluster, tc.cluster)
			}
			wantAddrs := 1
			if tc.cluster {
				wantAddrs = 3
			}
			if n := len(strings.Split(s.Addr(), ",")); n != wantAddrs {
				t.Fatalf("Addr() = %q, want %d addresses", s.Addr(), wantAddrs)
			}
			mustPing(t, s.Client(t))
			c := NewClient(s.Addr()) // as a worker process connects
			defer c.Close()
			mustPing(t, c)
			if err := c.Set(ctxTimeout(t, 5*time.Second), "k", "v", 0).Err(); err != nil {
				t.Fatalf("SET through NewClient: %v", err)
			}
		})
	}
}

func TestStartSharedFromEnvRefusesUnknownMode(t *testing.T) {
	t.Setenv(SharedEnv, "sentinel")
	if s, err := StartSharedFromEnv(); err == nil {
		_ = s.Close()
		t.Fatal("no error for an unknown mode")
	}
}
