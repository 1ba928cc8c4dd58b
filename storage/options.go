package storage

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/gocolly/colly/v2"
)

// Option configures a Storage. Options are applied in order by New, which
// reports invalid values; an Option holds no state and may be reused.
type Option func(*config)

type config struct {
	namespace      string
	visitedTTL     time.Duration
	buckets        int
	visibility     time.Duration
	maxFetch       time.Duration // 0 until WithMaxFetchTime sets it
	maxFetchSet    bool
	maxDeliveries  int
	retryDelay     time.Duration
	pollInterval   time.Duration
	maxRequestSize int
	maxQueued      int
	redisTimeout   time.Duration
	retryIf        func(*colly.Response, error) bool
	logger         *slog.Logger
}

func defaultConfig() config {
	return config{
		namespace:      "colly",
		buckets:        1 << 16,
		visibility:     time.Minute,
		maxDeliveries:  3,
		retryDelay:     5 * time.Second,
		pollInterval:   100 * time.Millisecond,
		maxRequestSize: 1 << 20,
		redisTimeout:   2 * time.Second,
		retryIf:        DefaultRetryIf,
	}
}

// Limits on values this package validates.
const (
	maxNamespaceLen = 200
	maxBuckets      = 1 << 24
	maxHostLen      = 255
	maxCookies      = 3000    // per registrable domain (cookie jar): every subdomain's cookies
	maxCookieBytes  = 4 << 20 // per registrable domain, all stored values together
	maxCookieValue  = 8192    // one stored value ("<flags>|<expires ms>|<line>"): a larger cookie is not stored
	// An earlier version's limits per host (and port) hash: one over them
	// was written by no version (cookies_get.lua deletes it).
	legacyMaxCookies     = 1000
	legacyMaxCookieBytes = 1 << 20
	maxReasonLen         = 1024 // dead-letter reason

	defaultMaxFetch = 10 * time.Minute
)

func (c *config) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...)
	}
	if err := checkNamespace(c.namespace); err != nil {
		return err
	}
	switch {
	case c.visitedTTL < 0:
		return bad("negative visited TTL %v", c.visitedTTL)
	case c.visitedTTL > 0 && c.visitedTTL < time.Millisecond:
		return bad("visited TTL %v is below 1ms", c.visitedTTL)
	case c.buckets < 1 || c.buckets > maxBuckets:
		return bad("%d visited buckets is outside 1..%d", c.buckets, maxBuckets)
	case c.visibility < 100*time.Millisecond:
		return bad("visibility timeout %v is below 100ms", c.visibility)
	case c.maxFetchSet && c.maxFetch < c.visibility:
		return bad("max fetch time %v is below the visibility timeout %v", c.maxFetch, c.visibility)
	case c.maxDeliveries < 1:
		return bad("max deliveries %d is below 1", c.maxDeliveries)
	case c.retryDelay < 0:
		return bad("negative retry delay %v", c.retryDelay)
	case c.pollInterval < time.Millisecond:
		return bad("poll interval %v is below 1ms", c.pollInterval)
	case c.maxRequestSize < 64:
		return bad("max request size %d is below 64 bytes", c.maxRequestSize)
	case c.maxQueued < 0:
		return bad("negative max queued requests %d", c.maxQueued)
	case c.redisTimeout <= 0:
		return bad("redis timeout %v must be positive", c.redisTimeout)
	}
	if !c.maxFetchSet {
		c.maxFetch = max(defaultMaxFetch, c.visibility)
	}
	if c.retryIf == nil {
		c.retryIf = DefaultRetryIf
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return nil
}

// checkNamespace accepts what makes an unambiguous key prefix: no braces
// (they would change the Redis Cluster hash tag), no spaces or control
// characters, at most 200 bytes.
func checkNamespace(ns string) error {
	if ns == "" || len(ns) > maxNamespaceLen {
		return fmt.Errorf("%w: namespace must be 1..%d bytes, got %d", ErrConfig, maxNamespaceLen, len(ns))
	}
	if strings.ContainsAny(ns, "{} ") || strings.ContainsFunc(ns, isControl) {
		return fmt.Errorf("%w: namespace %q must not contain braces, spaces or control characters", ErrConfig, ns)
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// WithNamespace sets the name under which all keys of this crawl live
// (visited set, cookies, queue). Collectors that share a namespace share
// that state; Clear removes one namespace and nothing else. It must not
// contain braces, spaces or control characters. The default is "colly".
// A ':' or '%' in it is escaped in the keys ("%3A", "%25"), so no
// namespace shares a key with another or with a proxy pool.
func WithNamespace(ns string) Option { return func(c *config) { c.namespace = ns } }

// WithVisitedTTL makes a visited mark expire after d, so the URL is crawled
// again afterwards (the time is Redis's own clock). Marks written without a
// TTL never expire, whatever later writers use. Expired marks are removed by
// sampling as new marks are written, and by Clear. The default is 0: marks
// never expire.
func WithVisitedTTL(d time.Duration) Option { return func(c *config) { c.visitedTTL = d } }

// WithVisitedBuckets sets how many Redis hashes hold the visited marks. Each
// bucket has its own Redis Cluster hash tag, so the set spreads over all
// nodes of a cluster; a bucket of up to 128 marks stays in Redis's compact
// listpack encoding (hash-max-listpack-entries). A mark there takes about
// 25 bytes when a queued delivery claimed it (it names the queue request,
// here a 7-digit ID; each further digit adds one), about 16 when another
// claim did, and with WithVisitedTTL about 40 and 28 (MEMORY USAGE of full
// 128-mark buckets on Redis 7.0, divided by 128; a plain hash, past 128,
// takes several times more). All
// collectors of a namespace must use the same value: the first Init records
// it and a different one gets ErrConfig (Clear forgets it). The default is
// 65536 (compact up to about 8 million URLs), the maximum 16777216.
func WithVisitedBuckets(n int) Option { return func(c *config) { c.buckets = n } }

// WithVisibilityTimeout sets how long a delivered request stays invisible to
// other workers before its fetch starts, and by how much a running fetch's
// invisibility is extended at a time. If the request is neither
// acknowledged nor failed by then (its worker died or hung before the
// fetch started, or Colly dropped it before sending), it is delivered
// again. Once the fetch that owns the delivery starts (Attach's OnRequest
// hook), a renewer goroutine keeps it invisible, extending its deadline to
// now + d every d/3, until the delivery is acknowledged or failed, or for
// at most WithMaxFetchTime; a worker that dies stops renewing, so its
// requests come back within d. So d need not cover a fetch's run time, only
// the wait from GetRequest to the fetch's start (for a free Colly thread)
// plus a renewal round trip; a request that waited longer than d/3 is
// checked with Redis when it starts, and is not fetched if it was
// delivered to another worker meanwhile. The default is 1 minute; the
// minimum 100ms.
func WithVisibilityTimeout(d time.Duration) Option { return func(c *config) { c.visibility = d } }

// WithMaxFetchTime bounds how long a running fetch is kept invisible (see
// WithVisibilityTimeout): d after the fetch started, the renewer stops
// extending its delivery, which then comes back within the visibility
// timeout unless it is acknowledged or failed first. It bounds the cost of
// a fetch that never settles: a request aborted by the user's own
// OnRequest callback after Attach's hook ran, a callback that panicked, a
// request Colly dropped after it started. A fetch that legitimately runs
// longer (a slow site, waits for a free proxy, retries through several
// proxies) may then be fetched twice. The default is 10 minutes, or the
// visibility timeout if that is longer; d must be at least the visibility
// timeout.
func WithMaxFetchTime(d time.Duration) Option {
	return func(c *config) { c.maxFetch, c.maxFetchSet = d, true }
}

// WithMaxDeliveries sets how many times a request is delivered before it is
// moved to the dead-letter list (failed, or not acknowledged within the
// visibility timeout, that many times). The default is 3.
func WithMaxDeliveries(n int) Option { return func(c *config) { c.maxDeliveries = n } }

// WithRetryDelay sets how long a failed request (Nack) waits before it is
// delivered again. The default is 5s.
func WithRetryDelay(d time.Duration) Option { return func(c *config) { c.retryDelay = d } }

// WithPollInterval bounds how long GetRequest waits, when nothing is ready
// but requests are still in flight, before it returns ErrQueueEmpty (Colly's
// queue then asks again). The default is 100ms.
func WithPollInterval(d time.Duration) Option { return func(c *config) { c.pollInterval = d } }

// WithMaxRequestSize bounds a serialized request (URL, headers, body,
// context) in bytes; larger ones are refused by AddRequest and dead-lettered
// by GetRequest. The default is 1 MiB.
func WithMaxRequestSize(n int) Option { return func(c *config) { c.maxRequestSize = n } }

// WithMaxQueued bounds the requests the namespace's queue holds at once,
// ready or in flight (dead letters do not count): AddRequest and AddURLs
// beyond it get ErrQueueFull and queue nothing, so a crawl that discovers
// links faster than it fetches them cannot fill Redis' memory. Colly's
// queue.AddURL and AddRequest return the error to the caller. Requeue of a
// dead letter is not refused. The limit is checked by each adding process
// with its own setting. The default is 0: no limit.
func WithMaxQueued(n int) Option { return func(c *config) { c.maxQueued = n } }

// WithRedisTimeout bounds every single Redis round trip (go-redis retries
// included), whatever the client's own timeouts: a client without
// Options.ContextTimeoutEnabled ignores context deadlines, so each call then
// runs on a watchdog goroutine; with it (on *redis.Client, *ClusterClient or
// *Ring), calls run inline, which is cheaper. A queue call that shares
// its round trip with concurrent ones (AddRequest, GetRequest, an
// acknowledgement: see the package doc) may wait for the round trip in
// flight before its own: up to twice d. The default is 2s.
func WithRedisTimeout(d time.Duration) Option { return func(c *config) { c.redisTimeout = d } }

// WithRetryIf decides, for a delivered request that reached Colly's OnError,
// whether it is retried (true: Nack, delivered again after the retry delay,
// dead-lettered after the last delivery) or done (false: acknowledged). The
// function must be fast, must not block and must not panic. The default is
// DefaultRetryIf.
func WithRetryIf(f func(r *colly.Response, err error) bool) Option {
	return func(c *config) { c.retryIf = f }
}

// WithLogger sets where the Storage logs the errors it cannot return: Colly's
// cookie methods and the acknowledgement hooks have no error result. It
// never logs passwords. The default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// DefaultRetryIf retries network errors (no response), 429 Too Many
// Requests and 5xx answers; any other error counts as done: a 404, a
// redirect to a URL another collector has, a request aborted on purpose
// from OnRequestHeaders or OnResponseHeaders.
func DefaultRetryIf(r *colly.Response, err error) bool {
	if r == nil || r.StatusCode == 0 {
		return !finalErr(err)
	}
	return r.StatusCode == http.StatusTooManyRequests || r.StatusCode >= 500
}
