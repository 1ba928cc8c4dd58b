// Package testbed is what the library's own tests add to the public
// proxyswitchtest package: a default product site ([ShopHandler],
// [DefaultHandler]) that sites and marketplaces serve when given no
// handler, groups of sites and proxies ([Bed], [TotalCollisions]), and the
// names the tests have always used for proxyswitchtest's proxies, sites,
// recorders and anti-bot layer (alias.go: [Marketplace] is
// proxyswitchtest.Guard).
//
// # Files
//
//   - alias.go: the proxyswitchtest names, and the constructors that default
//     to [DefaultHandler] ([NewSite], [NewTLSSite], [NewMarketplace]).
//   - handler.go: the default product-site handler ([ShopHandler]).
//   - bed.go: helpers working on groups of sites and proxies ([Bed],
//     [TotalCollisions]).
package testbed
