package estimate

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Family is a group of models that share a tokenizer, and so one set of
// counting weights.
type Family uint8

// The families the estimator knows. Every model not recognised as an
// OpenAI model counts as Other.
const (
	// O200k is the o200k_base tokenizer: gpt-4o, gpt-4.1, gpt-4.5, gpt-5,
	// o1, o3, o4, chatgpt-4o, codex and the gpt-oss models.
	O200k Family = iota
	// Cl100k is the cl100k_base tokenizer: gpt-4, gpt-4-turbo, gpt-3.5-turbo
	// and the text-embedding-3 and ada-002 embedding models.
	Cl100k
	// Other is every other model (Claude, Llama, Mistral, Gemini …). Their
	// tokenizers are not public or differ per vendor; the estimator counts
	// them with Cl100k's weights, which count more tokens than o200k for
	// the same text and so err on the side of debiting too much.
	Other
)

// String returns the family's tokenizer name.
func (f Family) String() string {
	switch f {
	case O200k:
		return "o200k"
	case Cl100k:
		return "cl100k"
	}
	return "other"
}

// FamilyOf maps a model name to its family. It accepts provider prefixes
// ("openai/gpt-4o", "azure/gpt-4o") and dated or fine-tuned names
// ("gpt-4o-2024-08-06", "ft:gpt-4o-mini:acme::abc").
func FamilyOf(model string) Family {
	if i := strings.LastIndexByte(model, '/'); i >= 0 {
		model = model[i+1:]
	}
	model = strings.TrimPrefix(model, "ft:")
	switch {
	case hasPrefixFold(model, "gpt-4o"), hasPrefixFold(model, "chatgpt-4o"),
		hasPrefixFold(model, "gpt-4.1"), hasPrefixFold(model, "gpt-4.5"),
		hasPrefixFold(model, "gpt-5"), hasPrefixFold(model, "gpt-oss"),
		hasPrefixFold(model, "codex"), hasPrefixFold(model, "o1"),
		hasPrefixFold(model, "o3"), hasPrefixFold(model, "o4"):
		return O200k
	case hasPrefixFold(model, "gpt-4"), hasPrefixFold(model, "gpt-3.5"),
		hasPrefixFold(model, "gpt-35"), hasPrefixFold(model, "text-embedding-"):
		return Cl100k
	}
	return Other
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// weights are the per-family costs of the pieces the counter splits text
// into, in tokens. The pieces follow the tokenizers' own pre-split (a run
// of letters with the space or the one punctuation character before it, up
// to three digits, a run of punctuation, a run of line breaks); the costs
// were fitted against the real o200k_base and cl100k_base tokenizers on
// prose, chat, code, JSON, logs and five languages (testdata/corpus with
// its exact counts in counts.tsv, checked by TestCountMatchesTheTokenizers)
// and checked on about 40 other files of licences, Go, Python and JSON.
type weights struct {
	// word is the cost of a piece of up to wordFree Latin letters (one
	// token: "the", " quick", "Println"); every further letter costs
	// letter, and an accented one (é, ü, ñ) costs accent more, because
	// the vocabularies, built mostly from English, split such words.
	word, letter, accent float64
	// alphaWord and alpha are the cost of a word of another alphabet
	// (Cyrillic, Greek, Arabic, Hebrew, Indic, Thai …) and of each of its
	// letters.
	alphaWord, alpha float64
	// ideo is the cost of one Han, Kana or Hangul character.
	ideo float64
	// punct is the cost of each byte of a run of two or more ASCII
	// punctuation characters; a single one costs a token unless it leads a
	// word (".Lock", "_id"). symbol is the cost of one other character that
	// is neither letter nor digit (emoji, ×, →).
	punct, symbol float64
	// newline is the cost of a run of line breaks not right after
	// punctuation ("{\n" is one piece); indent of a run of two or more
	// spaces or tabs. A single space before a word is free; one before a
	// digit or a line break is a token of its own.
	newline, indent float64
}

// wordFree is how many Latin letters a word piece has before further
// letters cost more. It is the same for every family so that the counter's
// features do not depend on the family.
const wordFree = 6

var familyWeights = [...]weights{
	O200k:  {word: 1, letter: 0.11, accent: 0.78, alphaWord: 0.18, alpha: 0.25, ideo: 0.69, punct: 0.65, symbol: 1.8, newline: 1, indent: 1},
	Cl100k: {word: 1, letter: 0.11, accent: 1.5, alphaWord: 0.05, alpha: 0.51, ideo: 0.95, punct: 0.64, symbol: 2.7, newline: 1, indent: 1},
	Other:  {word: 1, letter: 0.11, accent: 1.5, alphaWord: 0.05, alpha: 0.51, ideo: 0.95, punct: 0.64, symbol: 2.7, newline: 1, indent: 1},
}

// Count estimates the number of tokens f's tokenizer makes of text. It
// does not allocate and reads each byte once (see BenchmarkCount).
func Count(f Family, text string) int64 {
	var c counter
	for i := 0; i < len(text); {
		b := text[i]
		switch {
		case b >= utf8.RuneSelf:
			r, n := utf8.DecodeRuneInString(text[i:])
			c.rune(r)
			i += n
		case plainClass[b] == cStop: // control characters: a new line or a symbol
			c.ascii(b)
			i++
		default:
			i = run(&c, text, i)
		}
	}
	c.end()
	return c.f.tokens(f)
}

// features are what the counter finds in text, independent of the
// family: the estimate is their sum weighted by the family's weights, so a
// body can be counted in one pass before its model is known.
type features struct {
	words, longLetters, accents int64 // Latin word pieces, letters beyond wordFree, accented letters
	alphaWords, alphaLetters    int64 // words of other alphabets and their letters
	ideos, symbols              int64
	puncts, punctBytes          int64 // single punctuation characters, bytes of longer runs
	digits                      int64 // digit pieces of up to three digits
	newlines, indents, spaces   int64 // spaces: single spaces that are a token of their own
	exact                       int64 // tokens known exactly (token-id arrays, per-message overhead)
}

// tokens weighs the features with fam's weights, rounded to the nearest
// token.
func (f *features) tokens(fam Family) int64 {
	w := &familyWeights[fam]
	t := float64(f.words)*w.word + float64(f.longLetters)*w.letter + float64(f.accents)*w.accent +
		float64(f.alphaWords)*w.alphaWord + float64(f.alphaLetters)*w.alpha +
		float64(f.ideos)*w.ideo + float64(f.symbols)*w.symbol +
		float64(f.puncts) + float64(f.punctBytes)*w.punct +
		float64(f.newlines)*w.newline + float64(f.indents)*w.indent
	return int64(t+0.5) + f.digits + f.spaces + f.exact
}

// class is the kind of run the counter is in the middle of.
type class uint8

const (
	cNone    class = iota // nothing pending: start of text, after an ideograph or a symbol
	cWord                 // letters
	cDigit                // digits
	cPunct                // ASCII punctuation
	cSpace                // spaces and tabs
	cNewline              // line breaks
	cEnd                  // end of text (only as the next class of a flush)
	cStop                 // in plainClass: a byte run does not take
)

// counter is a streaming token counter: feed it a text's characters in
// order (ascii for bytes below 0x80, rune for the rest), call end at the
// end of each text and read f. It holds no buffer, so a JSON string can be
// counted while it is unescaped.
type counter struct {
	f     features
	cls   class
	n     int  // length of the current run: Latin letters, digits, bytes or spaces
	alpha int  // the current word's letters of other alphabets
	lower bool // the current word's last letter was lower case
	punct bool // the run before the current one was punctuation
}

// asciiClass classifies the 128 ASCII bytes.
var asciiClass = func() (t [utf8.RuneSelf]class) {
	for i := range t {
		switch b := byte(i); {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z':
			t[i] = cWord
		case b >= '0' && b <= '9':
			t[i] = cDigit
		case b == ' ', b == '\t':
			t[i] = cSpace
		case b == '\n', b == '\r':
			t[i] = cNewline
		default:
			t[i] = cPunct
		}
	}
	return t
}()

// plainClass is asciiClass for run, which takes no quote, backslash or
// control character (cStop): the JSON parser handles those itself.
var plainClass = func() (t [utf8.RuneSelf]class) {
	t = asciiClass
	for i := range t {
		if i < 0x20 || i == '"' || i == '\\' || i == 0x7f {
			t[i] = cStop
		}
	}
	return t
}()

// run counts the run of ASCII bytes of one class that starts at s[i]
// (plainClass not cStop) and returns where it ends. It is ascii's loop
// unrolled for a whole run: one table lookup per byte and a call per run,
// not per byte.
func run[T string | []byte](c *counter, s T, i int) int {
	b := s[i]
	k := plainClass[b]
	if k != c.cls {
		c.flush(k)
	} else if k == cWord && c.lower && b <= 'Z' {
		c.flush(cWord)
	}
	j := i
	if k == cWord {
		lower := c.lower
		for ; j < len(s); j++ {
			x := s[j]
			if x >= 'a' && x <= 'z' {
				lower = true
			} else if x >= 'A' && x <= 'Z' {
				if lower && j > i {
					break // camelCase: the caller's next run starts a piece
				}
			} else {
				break
			}
		}
		c.lower = lower
	} else {
		for j < len(s) && s[j] < utf8.RuneSelf && plainClass[s[j]] == k {
			j++
		}
	}
	c.n += j - i
	return j
}

func (c *counter) ascii(b byte) {
	k := asciiClass[b]
	if k != c.cls {
		c.flush(k)
	} else if k == cWord && c.lower && b <= 'Z' {
		// camelCase: the pre-split starts a new piece at a lower-to-upper
		// change, and the vocabularies rarely merge across it.
		c.flush(cWord)
	}
	if k == cWord {
		c.lower = b >= 'a'
	}
	c.n++
}

func (c *counter) rune(r rune) {
	switch {
	case isIdeographic(r):
		// Han, Kana and Hangul are letters to the pre-split, so a
		// sentence is one piece; the vocabularies then hold about one
		// character per token, which ideo says per family.
		c.flush(cNone)
		c.f.ideos++
	case unicode.IsLetter(r) || unicode.IsMark(r):
		if c.cls != cWord {
			c.flush(cWord)
		}
		if r < 0x250 { // Latin-1 and Latin Extended: accented Latin letters
			c.n++
			c.f.accents++
		} else {
			c.alpha++
		}
	case unicode.IsDigit(r):
		if c.cls != cDigit {
			c.flush(cDigit)
		}
		c.n++
	case unicode.IsSpace(r):
		if c.cls != cSpace {
			c.flush(cSpace)
		}
		c.n++
	default:
		c.flush(cNone)
		c.f.symbols++
	}
}

func isIdeographic(r rune) bool {
	// The common blocks (CJK Unified Ideographs, Kana, Hangul syllables)
	// without a table walk.
	if r >= 0x4E00 && r <= 0x9FFF || r >= 0x3040 && r <= 0x30FF || r >= 0xAC00 && r <= 0xD7AF {
		return true
	}
	return r >= 0x2E80 && (unicode.Is(unicode.Han, r) || unicode.Is(unicode.Hangul, r))
}

// flush counts the run that ends and starts one of class next.
func (c *counter) flush(next class) {
	f := &c.f
	switch c.cls {
	case cWord:
		if c.n > 0 {
			f.words++
			f.longLetters += int64(max(0, c.n-wordFree))
		} else {
			f.alphaWords++
		}
		f.alphaLetters += int64(c.alpha)
	case cDigit:
		f.digits += int64((c.n + 2) / 3) // the pre-split takes up to three digits
	case cPunct:
		// A single character before a word is the word's prefix piece
		// (".Lock", "_case", "(x"); a longer run is taken whole.
		switch {
		case c.n > 1:
			f.punctBytes += int64(c.n)
		case next != cWord:
			f.puncts++
		}
	case cSpace:
		// One space before a word, punctuation or a symbol rides with it;
		// a longer run (indentation, alignment) leaves a token of its own,
		// and a space before a digit, a line break or the end is one.
		if c.n >= 2 {
			f.indents++
		}
		if next == cDigit || next == cNewline || next == cEnd {
			f.spaces++
		}
	case cNewline:
		// Line breaks right after punctuation ride with it ("{\n", ",\n").
		if !c.punct {
			f.newlines++
		}
	}
	c.punct = c.cls == cPunct
	c.cls, c.n, c.alpha, c.lower = next, 0, 0, false
}

// end closes the current text: the next character starts a new one.
func (c *counter) end() {
	c.flush(cEnd)
	c.cls, c.punct = cNone, false
}
