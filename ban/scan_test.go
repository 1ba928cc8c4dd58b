package ban

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/andybalholm/cascadia"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scanPages are pages and selectors where the tag scan and the parsed
// document could disagree: it must never find what the document lacks.
var scanPages = []struct{ page, sel string }{
	{`<div class="item">x</div>`, "div.item"},
	{`<div class="a item b" id=main>x</div>`, "#main"},
	{`<div class="a item b" id=main>x</div>`, ".item"},
	{`<p data-x="1">`, "[data-x]"},
	{`<p data-x="1">`, `[data-x="1"]`},
	{`<p data-x="1">`, `p[data-x^="1"]`},
	{`<div class="item">x</div>`, "span.item"},
	{`<select><div class="item">x</div></select>`, ".item"},
	{`<template><div class="item">x</div></template>`, ".item"},
	{`<svg><div class="item"></div></svg>`, ".item"},
	{`<math><mi class="item"></mi></math>`, ".item"},
	{`<body class="item">`, ".item"},
	{`<html class="item">`, "html.item"},
	{`<image class="item">`, "image"},
	{`<image class="item">`, "img.item"},
	{`<script><div class="item"></div></script>`, ".item"},
	{`<textarea><div class="item"></div></textarea>`, ".item"},
	{`<title><div class="item"></div></title>`, ".item"},
	{`<noscript><div class="item"></div></noscript>`, ".item"},
	{`<style><div class="item"></div></style>`, ".item"},
	{`<!-- <div class="item"> -->`, ".item"},
	{`<div class="&#105;tem">x</div>`, ".item"},
	{`<DIV CLASS="item">x</DIV>`, "div.item"},
	{`<table><div class="item">x</div></table>`, ".item"},
	{`<div class="item">` + strings.Repeat("<div>", 600) + "deep" + strings.Repeat("</div>", 600), ".item"},
	{`<div class="item">` + strings.Repeat("<p><span>", 300), ".item"},
	{`<my-widget class="item"></my-widget>`, "my-widget.item"},
	{`<plaintext><div class="item">`, ".item"},
	{"\x00\xff\xfe<<<div class=item", ".item"},
}

// TestScanNeverFindsWhatTheDocumentLacks: what scanFinds finds, the
// parsed document has; and it does find plain cases.
func TestScanNeverFindsWhatTheDocumentLacks(t *testing.T) {
	found := 0
	for i, c := range scanPages {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if scanFinds(t, c.page, c.sel) {
				found++
			}
		})
	}
	assert.GreaterOrEqual(t, found, 7, "the plain cases are found by the scan")
}

// scanFinds checks scanFinds against the document for one page and
// selector (each a quickSelector), and returns what the scan said.
func scanFinds(t testing.TB, page, sel string) bool {
	if !quickSelector.MatchString(sel) {
		t.Skip("not a quick selector")
	}
	cs, err := cascadia.Compile(sel)
	if err != nil {
		t.Skip("does not compile")
	}
	x := &Exchange{Body: []byte(page), Header: http.Header{"Content-Type": {"text/html"}}}
	scanned := x.scanFinds([]cascadia.Selector{cs})
	doc, err := (&Exchange{Body: []byte(page), Header: x.Header}).Document()
	if scanned {
		require.NoError(t, err, "the scan found %q in a page the parser refuses: %q", sel, page)
		require.True(t, containsAll(doc, []cascadia.Selector{cs}), "the scan found %q, the document lacks it: %q", sel, page)
	}
	return scanned
}

func FuzzScanFinds(f *testing.F) {
	for _, c := range scanPages {
		f.Add(c.page, c.sel)
	}
	f.Fuzz(func(t *testing.T, page, sel string) { scanFinds(t, page, sel) })
}

func TestQuickSelector(t *testing.T) {
	for sel, quick := range map[string]bool{
		"div": true, "div.item": true, "#main": true, ".a.b": true, "*": true, `a[href]`: true, `a[href^="http"]`: true,
		"div .item": false, "div > p": false, "p:first-child": false, "a, b": false, "li:nth-child(2)": false,
		`a[href="x y"]`: true, `a[href="]"]`: true, "": true,
	} {
		assert.Equal(t, quick, quickSelector.MatchString(sel), sel)
	}
}

// BenchmarkExpect: the built-in check of WithExpect on an 8 KiB product
// page (the selector near its top, a description, 100 related links), by
// the tag scan (quick) and by parsing the document as before (parse), side
// by side:
//
//	go test -run '^$' -bench BenchmarkExpect -benchmem -count 5 ./ban
func BenchmarkExpect(b *testing.B) {
	var related strings.Builder
	for i := range 100 {
		fmt.Fprintf(&related, `<li class="related"><a href="/p/%d">Product %d</a></li>`, i, i)
	}
	page := `<html><head><title>Product 7</title></head><body><div class="product" data-id="7">Product 7</div>` +
		`<p class="description">` + strings.Repeat("A fine product, described at length. ", 2<<10/37) + `</p>` +
		`<ul>` + related.String() + `</ul></body></html>` // about 8 KiB, 200 elements
	for _, mode := range []string{"quick", "parse"} {
		b.Run("mode="+mode, func(b *testing.B) {
			rules := DefaultRules()
			rules.Expect = []Expect{{Selectors: []string{"div.product"}}}
			d, err := NewDetector(rules)
			if err != nil {
				b.Fatal(err)
			}
			d.expects[0].quick = mode == "quick"
			u, _ := url.Parse("http://shop.example/p/7")
			hdr := http.Header{"Content-Type": {"text/html; charset=utf-8"}}
			b.ReportAllocs()
			b.SetBytes(int64(len(page)))
			for range b.N {
				x := &Exchange{Site: "shop.example", URL: u, OriginURL: u, StatusCode: 200, Header: hdr, Body: []byte(page)}
				if v, err := d.Classify(x); err != nil || v.Kind != OK {
					b.Fatal(v, err)
				}
			}
		})
	}
}
