package dns

import (
	"fmt"
	"math"
	"strings"
)

// checkShape refuses question names shaped like DNS tunnel traffic: names
// or labels longer than the limits, labels with characters no hostname
// has, and long labels that look like encoded data (see randomLabel). name
// is lower case without a trailing dot; "" is the root.
func checkShape(name string, cfg *Config) error {
	if len(name) > cfg.MaxNameLen {
		return fmt.Errorf("name is %d characters long, over the limit of %d (DNS tunnels use long names)", len(name), cfg.MaxNameLen)
	}
	if name == "" {
		return nil
	}
	for l := range strings.SplitSeq(name, ".") {
		if len(l) > cfg.MaxLabelLen {
			return fmt.Errorf("label of %d characters, over the limit of %d (DNS tunnels use long labels)", len(l), cfg.MaxLabelLen)
		}
		if l == "" {
			return fmt.Errorf("empty label")
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("label %q has a character no hostname has (%q)", l, c)
			}
		}
		if why := randomLabel(l, cfg.RandomLabelLen); why != "" {
			return fmt.Errorf("label %q looks like encoded data (%s)", l, why)
		}
	}
	return nil
}

// separators are the characters hostnames use between words.
var separators = strings.NewReplacer("-", "", "_", "")

// randomLabel says why a label of lower-case letters, digits, '-' and '_'
// looks like encoded data rather than a hostname someone chose, or returns
// "". Only labels with at least minLen characters (separators not counted)
// are judged: short random labels are common (CDN node names) and carry
// little data. It recognizes:
//
//   - hex: only 0-9a-f with both digits and letters (hashes, hex encoding);
//   - letters and digits interleaved far more often than in words with a
//     number in them (base32, base36 and similar encodings);
//   - letters whose frequencies are far from those of English words and
//     abbreviations (random letters use j, q, x, z, v, k as often as e).
//
// It is a heuristic; the per-zone name budget catches what it misses.
func randomLabel(label string, minLen int) string {
	s := separators.Replace(label)
	n := len(s)
	if n < minLen || n == 0 {
		return ""
	}
	var digits, letters, hexLetters, switches int
	prevDigit := false
	for i := 0; i < n; i++ {
		c := s[i]
		isDigit := c >= '0' && c <= '9'
		if isDigit {
			digits++
		} else {
			letters++
			if c <= 'f' {
				hexLetters++
			}
		}
		if i > 0 && isDigit != prevDigit {
			switches++
		}
		prevDigit = isDigit
	}
	if letters <= 1 {
		return "a long number"
	}
	if hexLetters == letters && digits >= 2 {
		return "hex digits"
	}
	if digits >= 3 && switches*5 >= n {
		return "letters and digits interleaved"
	}
	if letters >= minLen/2 {
		if score := letterScore(s); score < randomLetterScore {
			return fmt.Sprintf("letter frequencies unlike words (%.2f)", score)
		}
	}
	return ""
}

// letterFreq is the frequency of each letter in English text, in percent.
var letterFreq = [26]float64{
	8.2, 1.5, 2.8, 4.3, 12.7, 2.2, 2.0, 6.1, 7.0, 0.15, 0.77, 4.0, 2.4,
	6.7, 7.5, 1.9, 0.095, 6.0, 6.3, 9.1, 2.8, 0.98, 2.4, 0.15, 2.0, 0.074,
}

// letterWeight[c] is log2(p_english(c) / (1/26)): positive for letters
// words use often, strongly negative for rare ones.
var letterWeight = func() (w [26]float64) {
	for i, f := range letterFreq {
		w[i] = math.Log2(f / 100 * 26)
	}
	return w
}()

// randomLetterScore is the letterScore below which letters look random:
// English scores about +0.5, uniformly random letters about -0.9; hostnames
// with abbreviations (npm, mcr, jammy) go down to about -0.2.
const randomLetterScore = -0.3

// letterScore is the mean letterWeight of the letters in s (digits are
// skipped), a unigram log-likelihood ratio of "English" against "uniformly
// random".
func letterScore(s string) float64 {
	var sum float64
	n := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'a' && c <= 'z' {
			sum += letterWeight[c-'a']
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}
