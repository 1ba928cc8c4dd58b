package probe

// SetExitPage sets the HSCAN count of one exit_list.lua page and returns
// a function that restores the old one (tests read a large exit hash in
// many pages).
func SetExitPage(n int) (restore func()) {
	old := exitPage
	exitPage = n
	return func() { exitPage = old }
}
