// Package signalauth authenticates the records of the Kafka topics whose
// records are orders: the signals topic (sluice.signals.v1), the admin
// topic (sluice.admin.v1) and the alerter's state topic. The enforcer lifts
// quota breakers on a period_reset and the alerter resolves alerts on one;
// an admin record lifts a blacklist or raises a quota; an alerter state
// record says what was already notified (a forged one silences an alert, a
// forged held notification is sent to a channel as it is). Without it,
// anyone who can produce to Kafka could do each of these. Producers sign
// each record with HMAC-SHA256 under a key shared with the consumers, which
// refuse — and count — records that are unsigned or badly signed.
//
// One key ring (the root setting signal_auth, [Config]) serves every
// stream, and each stream ([Stream]) has its own MAC domain, so a record
// signed for one stream is refused on another: a genuine signal copied onto
// the admin topic verifies as nothing. [Open] returns the signals' Auth;
// [Auth.For] the same ring for another stream.
//
// The MAC covers the stream's domain, the record key, the schema header,
// the value (a tombstone's nil value included: a forged deletion is refused
// like a forged record) and the id of the key that made it,
// length-prefixed so no two different records share an input. It travels
// in two record headers: [HeaderKeyID] names the key, [HeaderSignature]
// holds the hex MAC. Keys rotate: verifiers accept every key of their
// ring, signers use one (see [Config]).
//
// The admin and alerter state topics are compacted and outlive any
// upgrade: records written before they were signed are refused too, unless
// [Config.AcceptUnsignedState] admits them during a migration ([Auth.Admit]).
//
// Compaction does not read signatures: it keeps the last record of each
// record key, whoever produced it, so on the compacted topics an unsigned
// tombstone that every reader refuses would still delete the signed record
// of its key. Their records are therefore keyed by [Auth.RecordKey], a MAC
// of the logical key that no one without a key of the ring can compute
// (see that method for what that does and does not protect).
//
// What it does not do: it does not stop a replay of a genuine record by
// itself (the consumers drop repeated signal ids and stale periods for
// signals; admin records carry a per-scope version their readers track,
// see internal/adminlog), and it does not hide records from readers. It depends on nothing but franz-go's record type,
// so it adds no server dependency to whoever imports it.
package signalauth

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"os"
	"regexp"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/schemas"
)

// Record headers a signed signal carries.
const (
	// HeaderSignature is the hex HMAC-SHA256 of the record (see package doc).
	HeaderSignature = "sluice-sig"
	// HeaderKeyID names the key of the ring that made HeaderSignature.
	HeaderKeyID = "sluice-kid"
)

// Modes of [Config].
const (
	// ModeHMAC signs and verifies; it is what an empty mode means.
	ModeHMAC = "hmac"
	// ModeOff neither signs nor verifies: development only.
	ModeOff = "off"
)

// MinSecretBytes is the shortest secret accepted: HMAC-SHA256 is only as
// strong as its key, and 32 bytes is its block of security.
const MinSecretBytes = 32

// Stream names the records an Auth signs and verifies; its value is the
// stream's MAC domain, which separates its MACs from every other stream's
// and from any other use of the same secret.
type Stream string

// The authenticated streams.
const (
	// Signals are the records of the signals topic (sluice.signals.v1),
	// signed by the aggregator and the reconciler.
	Signals Stream = "sluice-signal-auth-v1"
	// AdminActions are the records of the admin topic (sluice.admin.v1),
	// signed by the enforcer's admin API and read by the enforcer and the
	// aggregator.
	AdminActions Stream = "sluice-admin-auth-v1"
	// AlerterState are the records of the alerter's state topic, signed
	// and read by the alerter.
	AlerterState Stream = "sluice-alerter-state-auth-v1"
	// ControlPlane are the control-plane records (API keys) of the admin
	// topic, signed by the enforcer's admin API and read by the enforcer
	// and the gateways. A domain of their own keeps an operator action's
	// signature from ever verifying as a key record, and the reverse.
	ControlPlane Stream = "sluice-controlplane-auth-v1"
)

var keyIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Config is the root-level signal_auth setting every signal producer and
// consumer shares. The secrets are never logged; only key ids are.
type Config struct {
	Mode    string   `yaml:"mode" help:"hmac (default): sign produced signals, admin actions and alerter state, and refuse unsigned or badly signed ones; off: no signing, no checking — anyone who can produce to the signals or admin topic can lift a quota breaker or a blacklist (development only; warned at start)"`
	KeyFile string   `yaml:"key_file" help:"file of signing keys, one key_id:secret per line (# comments), each secret at least 32 bytes (e.g. openssl rand -hex 32); verifiers accept every key, signers use sign_key"`
	Keys    []string `yaml:"keys" help:"signing keys as key_id:secret, added to those of key_file; prefer key_file or the environment, a flag shows in the process list"`
	SignKey string   `yaml:"sign_key" help:"id of the key signers use; empty: the first key (of key_file, then keys). Rotate by adding the new key everywhere, then switching sign_key, then removing the old key once the signals topic's retention has passed and the admin actions it signed expired or were re-issued (docs/scaling.md)"`
	// AcceptUnsignedState admits unsigned records of the compacted admin
	// and alerter state topics, which hold records written before Sluice
	// signed them: refusing those at an upgrade would lift every blacklist
	// in force. Badly signed records are refused all the same, and signals
	// are never admitted unsigned.
	AcceptUnsignedState bool `yaml:"accept_unsigned_state" help:"migration only: accept unsigned records on the admin topic and the alerter state topic (written before they were signed), counted and warned; never signals. Turn off once every admin action in force was re-issued and the alerters ran a while (docs/scaling.md)"`
}

// Validate checks what can be checked without reading the key file. The
// errors name the field and never a secret.
func (c Config) Validate() error {
	if c.Mode != "" && c.Mode != ModeHMAC && c.Mode != ModeOff {
		return fmt.Errorf("signal_auth.mode: %q is not hmac or off", c.Mode)
	}
	_, err := parseKeys(c.Keys, "signal_auth.keys")
	return err
}

// Auth signs and verifies the records of one [Stream]. A nil *Auth
// verifies nothing: Verify refuses every record, so forgetting to
// configure it fails closed.
type Auth struct {
	off    bool
	keys   map[string][]byte
	signID string
	stream Stream
	// acceptUnsigned is Config.AcceptUnsignedState; Admit applies it to
	// every stream but Signals.
	acceptUnsigned bool
}

// Errors of Verify; all of them mean "refused".
var (
	ErrUnsigned      = errors.New("record is not signed (no " + HeaderSignature + " header)")
	ErrUnknownKey    = errors.New("record is signed with a key id this service does not know")
	ErrBadSignature  = errors.New("record's signature does not match")
	ErrNotConfigured = errors.New("record authentication (signal_auth) is not configured")
)

// Open builds the Auth of c for [Signals] (see [Auth.For] for the other
// streams): it reads the key file, checks every key and the sign key, and
// warns once when mode is off or unsigned state records are accepted. The errors name the field
// and the limit, never a secret.
func Open(c Config, log *slog.Logger) (*Auth, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Mode == ModeOff {
		if log != nil {
			log.Warn("signal_auth.mode is off: signals, admin actions and alerter state are neither signed nor verified; anyone who can produce to their topics can lift quota breakers and blacklists and resolve alerts (development only)")
		}
		return &Auth{off: true, stream: Signals}, nil
	}
	var entries []entry
	if c.KeyFile != "" {
		lines, err := readKeyFile(c.KeyFile)
		if err != nil {
			return nil, err
		}
		fromFile, err := parseKeys(lines, "signal_auth.key_file "+c.KeyFile)
		if err != nil {
			return nil, err
		}
		entries = fromFile
	}
	inline, _ := parseKeys(c.Keys, "signal_auth.keys")
	entries = append(entries, inline...)
	if len(entries) == 0 {
		return nil, errors.New("signal_auth: no key: set signal_auth.key_file (or keys, env SLUICE_SIGNAL_AUTH_KEYS) to the same key_id:secret on every service, or signal_auth.mode: off to run without signal authentication (development only)")
	}
	a := &Auth{keys: make(map[string][]byte, len(entries)), signID: c.SignKey, stream: Signals, acceptUnsigned: c.AcceptUnsignedState}
	for _, e := range entries {
		if old, dup := a.keys[e.id]; dup && !hmac.Equal(old, e.secret) {
			return nil, fmt.Errorf("signal_auth: key id %q is given twice with different secrets; give each key its own id", e.id)
		}
		a.keys[e.id] = e.secret
	}
	if a.signID == "" {
		a.signID = entries[0].id
	}
	if _, ok := a.keys[a.signID]; !ok {
		return nil, fmt.Errorf("signal_auth.sign_key: %q is not among the configured key ids", a.signID)
	}
	if log != nil {
		ids := make([]string, 0, len(entries))
		for _, e := range entries {
			ids = append(ids, e.id)
		}
		log.Info("signal authentication on", "sign_key", a.signID, "key_ids", ids)
		if a.acceptUnsigned {
			log.Warn("signal_auth.accept_unsigned_state is on: unsigned records of the admin and alerter state topics are accepted, so anyone who can produce to them can lift a blacklist or silence an alert; turn it off once the migration is done (docs/scaling.md)")
		}
	}
	return a, nil
}

// For returns the Auth of stream s: the same key ring and settings, the
// MAC domain of s. A nil a gives nil, which refuses everything.
func (a *Auth) For(s Stream) *Auth {
	if a == nil {
		return nil
	}
	b := *a
	b.stream = s
	return &b
}

// Off reports whether a signs and verifies nothing.
func (a *Auth) Off() bool { return a != nil && a.off }

// Record returns a record of a's stream for topic, keyed by key, with the
// stream's schema header (signal v1, admin v1; none for the alerter state)
// and, unless a is off, its signature. A nil value is a tombstone.
func (a *Auth) Record(topic string, key, value []byte) *kgo.Record {
	r := &kgo.Record{Topic: topic, Key: key, Value: value}
	stream := Signals
	if a != nil {
		stream = a.stream
	}
	switch stream {
	case Signals:
		r.Headers = []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaSignalsV1)}}
	case AdminActions:
		r.Headers = []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaAdminV1)}}
	case ControlPlane:
		r.Headers = []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaControlPlaneV1)}}
	}
	a.Sign(r)
	return r
}

// Sign adds the key id and signature headers to r with the sign key,
// replacing any it had; with a off (or nil) it leaves r alone. Headers are
// signed as they are: set the schema header before signing.
func (a *Auth) Sign(r *kgo.Record) {
	if a == nil || a.off {
		return
	}
	hs := r.Headers[:0:0]
	for _, h := range r.Headers {
		if h.Key != HeaderSignature && h.Key != HeaderKeyID {
			hs = append(hs, h)
		}
	}
	mac := macWith(a.keys[a.signID], a.stream, a.signID, r.Key, schemaOf(hs), r.Value)
	r.Headers = append(hs,
		kgo.RecordHeader{Key: HeaderKeyID, Value: []byte(a.signID)},
		kgo.RecordHeader{Key: HeaderSignature, Value: []byte(hex.EncodeToString(mac))})
}

// Verify returns nil when r carries a valid signature by a key of the
// ring, or when a is off; otherwise the reason it is refused. The compare
// is constant-time. A record with a header of the signature, key id or
// schema given twice is refused: which of the two a consumer reads must
// not be a question.
func (a *Auth) Verify(r *kgo.Record) error {
	if a == nil {
		return ErrNotConfigured
	}
	if a.off {
		return nil
	}
	var sig, kid, schema []byte
	var nSig, nKid, nSchema int
	for _, h := range r.Headers {
		switch h.Key {
		case HeaderSignature:
			sig, nSig = h.Value, nSig+1
		case HeaderKeyID:
			kid, nKid = h.Value, nKid+1
		case schemas.HeaderSchema:
			schema, nSchema = h.Value, nSchema+1
		}
	}
	if nSig == 0 {
		return ErrUnsigned
	}
	if nSig > 1 || nKid > 1 || nSchema > 1 {
		return fmt.Errorf("%w: a signature, key id or schema header is repeated", ErrBadSignature)
	}
	key, ok := a.keys[string(kid)]
	if !ok {
		return ErrUnknownKey
	}
	got := make([]byte, sha256.Size)
	if len(sig) != 2*sha256.Size {
		return ErrBadSignature
	}
	if _, err := hex.Decode(got, sig); err != nil {
		return ErrBadSignature
	}
	want := macWith(key, a.stream, string(kid), r.Key, schema, r.Value)
	if !hmac.Equal(got, want) {
		return ErrBadSignature
	}
	return nil
}

// Admit is Verify for the consumers of the compacted streams (admin
// actions, alerter state), whose topics hold records written before they
// were signed: with Config.AcceptUnsignedState an unsigned record is
// admitted and unsigned is true, for the caller to count and warn about.
// A badly signed record is refused all the same, and so is an unsigned
// signal.
func (a *Auth) Admit(r *kgo.Record) (unsigned bool, err error) {
	err = a.Verify(r)
	// Control-plane records were signed from their first release: none is
	// admitted unsigned.
	if errors.Is(err, ErrUnsigned) && a.acceptUnsigned && a.stream != Signals && a.stream != ControlPlane {
		return true, nil
	}
	return false, err
}

// Reason is a short label for err, for logs and metrics: unsigned,
// unknown_key, bad_signature or not_configured.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrUnsigned):
		return "unsigned"
	case errors.Is(err, ErrUnknownKey):
		return "unknown_key"
	case errors.Is(err, ErrNotConfigured):
		return "not_configured"
	}
	return "bad_signature"
}

// recordKeyPrefix starts every derived record key, so that it can never
// equal a logical key written before keys were derived (admin keys start
// with a tenant, alert keys with a tenant or a NUL byte).
const recordKeyPrefix = "\x00k1."

// RecordKey returns the record key under which a compacted stream stores
// the record of logical: a fixed prefix and the hex HMAC-SHA256 of
// logical, under the sign key, in a domain of the stream's own (distinct
// from its signatures'). Kafka's compaction keeps the last record of each
// record key whoever produced it; with the logical key as the record key
// (tenant, kind, scope) anyone able to produce could write a tombstone
// that readers refuse but compaction obeys, deleting a signed blacklist.
// A producer who holds no key of the ring and cannot read the topic cannot
// compute or copy this key; one who can read the topic can copy it, which
// is why the docs (docs/scaling.md) give the ACLs that keep WRITE on these
// topics to Sluice's own principals and READ to its services. With mode
// off (or a nil a) it is logical itself.
func (a *Auth) RecordKey(logical []byte) []byte {
	if a == nil || a.off {
		return append([]byte(nil), logical...)
	}
	return recordKeyWith(a.keys[a.signID], a.stream, logical)
}

// RecordKeys returns every record key a record of logical may have been
// written under: its RecordKey under each key of the ring (a record keeps
// the key it was written with across a rotation) and logical itself (a
// release that did not derive keys). A writer deleting logical's record
// writes a tombstone of each, so no older copy survives compaction.
func (a *Auth) RecordKeys(logical []byte) [][]byte {
	out := [][]byte{append([]byte(nil), logical...)}
	if a == nil || a.off {
		return out
	}
	for _, secret := range a.keys {
		out = append(out, recordKeyWith(secret, a.stream, logical))
	}
	return out
}

// RecordKeyMatches reports whether r's key is logical's RecordKey under
// the key that signed r (its key id header). Mode off compares with
// logical itself.
func (a *Auth) RecordKeyMatches(r *kgo.Record, logical []byte) bool {
	if a == nil {
		return false
	}
	if a.off {
		return string(r.Key) == string(logical)
	}
	var kid []byte
	for _, h := range r.Headers {
		if h.Key == HeaderKeyID {
			kid = h.Value
		}
	}
	secret, ok := a.keys[string(kid)]
	return ok && hmac.Equal(r.Key, recordKeyWith(secret, a.stream, logical))
}

func recordKeyWith(secret []byte, stream Stream, logical []byte) []byte {
	m := hmac.New(sha256.New, secret)
	writeField(m, []byte(string(stream)+"#record-key"))
	writeField(m, logical)
	sum := m.Sum(nil)
	out := make([]byte, len(recordKeyPrefix)+hex.EncodedLen(len(sum)))
	copy(out, recordKeyPrefix)
	hex.Encode(out[len(recordKeyPrefix):], sum)
	return out
}

func macWith(secret []byte, stream Stream, kid string, key, schema, value []byte) []byte {
	m := hmac.New(sha256.New, secret)
	writeField(m, []byte(stream))
	writeField(m, []byte(kid))
	writeField(m, key)
	writeField(m, schema)
	writeField(m, value)
	return m.Sum(nil)
}

// writeField writes b length-prefixed, so that field boundaries are part of
// what is signed.
func writeField(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// SchemaOf returns r's schema header (schemas.HeaderSchema), empty for
// none, so that a reader of a topic two streams share can tell them apart
// before verifying.
func SchemaOf(r *kgo.Record) string { return string(schemaOf(r.Headers)) }

func schemaOf(hs []kgo.RecordHeader) []byte {
	for _, h := range hs {
		if h.Key == schemas.HeaderSchema {
			return h.Value
		}
	}
	return nil
}

type entry struct {
	id     string
	secret []byte
}

// parseKeys parses key_id:secret entries; where names the source in
// errors, which give the entry's position and never its secret.
func parseKeys(lines []string, where string) ([]entry, error) {
	var out []entry
	var errs []error
	for i, l := range lines {
		id, secret, ok := strings.Cut(strings.TrimSpace(l), ":")
		id, secret = strings.TrimSpace(id), strings.TrimSpace(secret)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s: entry %d: want key_id:secret", where, i+1))
		case !keyIDPattern.MatchString(id):
			errs = append(errs, fmt.Errorf("%s: entry %d: key id %q must be 1..64 of A-Z a-z 0-9 . _ -", where, i+1, id))
		case len(secret) < MinSecretBytes:
			errs = append(errs, fmt.Errorf("%s: entry %d (key id %q): the secret is %d bytes, want at least %d (openssl rand -hex 32)", where, i+1, id, len(secret), MinSecretBytes))
		default:
			out = append(out, entry{id: id, secret: []byte(secret)})
		}
	}
	return out, errors.Join(errs...)
}

// readKeyFile returns the key lines of path, without blanks and comments.
func readKeyFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("signal_auth.key_file: %w", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("signal_auth.key_file %s: %w", path, err)
	}
	return lines, nil
}
