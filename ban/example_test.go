package ban_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"

	"github.com/proxyswitch/proxyswitch/ban"
)

// A classifier of one's own: a page saying "access limited" with a 200 is a
// ban. With proxyswitch it is given to the Switch by
// proxyswitch.WithClassifier(accessLimited); here a Detector runs it before
// the built-in checks.
func ExampleClassifier() {
	accessLimited := func(x *ban.Exchange) ban.Verdict {
		if x.StatusCode == http.StatusOK && bytes.Contains(x.Body, []byte("Доступ ограничен")) {
			return ban.Verdict{Kind: ban.Ban, Reason: "access_limited"}
		}
		return ban.Verdict{Kind: ban.Pass} // the built-in checks decide
	}

	rules := ban.DefaultRules()
	rules.Classifiers = append(rules.Classifiers, accessLimited)
	d, err := ban.NewDetector(rules)
	if err != nil {
		panic(err)
	}
	u, _ := url.Parse("https://shop.example/p/1")
	for _, page := range []struct {
		code int
		body string
	}{
		{200, "<p>Доступ ограничен</p>"},
		{429, ""},
		{200, "<div class=product>...</div>"},
		{404, "not here"},
	} {
		v, _ := d.Classify(&ban.Exchange{Site: u.Host, URL: u, OriginURL: u, StatusCode: page.code,
			Header: http.Header{"Content-Type": {"text/html"}}, Body: []byte(page.body)})
		fmt.Printf("%d: %v %q\n", page.code, v.Kind, v.Reason)
	}
	// Output:
	// 200: ban "access_limited"
	// 429: ban "http_429"
	// 200: ok ""
	// 404: neutral ""
}
