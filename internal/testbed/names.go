package testbed

// Spellings returns every string of 1 to maxLen bytes over alphabet, shorter
// first: the names a property test of a key encoding runs through (with the
// separator, the escape and the bytes an escape is spelt with in alphabet,
// every way two encodings could meet is among them).
func Spellings(alphabet string, maxLen int) []string {
	names := []string{""}
	var out []string
	for n := 1; n <= maxLen; n++ {
		next := make([]string, 0, len(names)*len(alphabet))
		for _, s := range names {
			for i := 0; i < len(alphabet); i++ {
				next = append(next, s+alphabet[i:i+1])
			}
		}
		names = next
		out = append(out, names...)
	}
	return out
}
