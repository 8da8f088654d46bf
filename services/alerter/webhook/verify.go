package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Verify is how a receiver checks a delivery of Sluice's webhook channel
// kind. docs/webhooks.md carries this function for receivers to copy (it
// uses the standard library only); a test holds the two copies equal.
//
// It checks, in this order, that the webhook-id, webhook-timestamp and
// webhook-signature headers are present, that webhook-timestamp (Unix
// seconds, set per delivery attempt) lies within tolerance of now (the
// replay window; 5 minutes is usual), and that one of the space-separated
// "v1,<base64>" entries of webhook-signature equals
// base64(HMAC-SHA256(key, webhook-id + "." + webhook-timestamp + "." +
// body)), compared in constant time. body must be the raw request body,
// before any JSON decoding. The key is the channel's secret: the bytes
// after "whsec_" base64-decoded when it starts so (the Standard Webhooks
// form), else its UTF-8 bytes.
//
// A nil error means Sluice sent body. Deduplicate on the id of each event
// in the body (retries and restarts repeat it), not on delivery time.
func Verify(secret string, header http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	id := header.Get("webhook-id")
	ts := header.Get("webhook-timestamp")
	sigs := header.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature header")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("webhook: webhook-timestamp is not Unix seconds")
	}
	if age := now.Sub(time.Unix(sec, 0)); age > tolerance || age < -tolerance {
		return errors.New("webhook: webhook-timestamp is outside the replay window")
	}
	key := []byte(secret)
	if b64, ok := strings.CutPrefix(secret, "whsec_"); ok {
		if key, err = base64.StdEncoding.DecodeString(b64); err != nil {
			return errors.New("webhook: the secret after whsec_ is not base64")
		}
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(sigs) {
		version, b64, _ := strings.Cut(sig, ",")
		got, err := base64.StdEncoding.DecodeString(b64)
		if version == "v1" && err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("webhook: no valid signature")
}
