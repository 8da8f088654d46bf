package console

import (
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/sluicehq/sluice/adminapi"
)

// formState is a form the admin API refused, shown again in place: the
// page is rendered anew (with the refusal's status, never a generic error
// page) with what the user typed kept and each message of the refusal
// next to the input it names. The API names the bad field first in each
// message ("models[0]: ...", "expires_in: ..."); inputs maps those field
// names to the form's inputs, and a message that names none is shown
// above the form.
//
// Every console form that posts to the admin API uses it: the handler
// builds one with refusal and renders its page with it; the template
// reads Value, Err and Errors by the form's Name (one page has several
// forms) and the shared "field-error" and "form-errors" templates
// (layout.html) draw the messages.
type formState struct {
	// Name tells which form of the page was refused ("" for none).
	Name   string
	Values url.Values
	// Fields are the messages by input name; Errors name no input.
	Fields map[string][]string
	Errors []string
	// Status is the console's answer: 422 for a refused value, the API's
	// 403, 404, 409, 503, or 502 when it did not answer.
	Status int
}

// refusal turns the admin API's refusal err of form name (posted with
// values) into its formState.
func refusal(name string, values url.Values, err error, inputs map[string]string) formState {
	f := formState{Name: name, Values: values, Fields: map[string][]string{}}
	var ae *adminapi.Error
	if !errors.As(err, &ae) {
		f.Status = http.StatusBadGateway
		f.Errors = []string{"The enforcer's admin API did not answer, so nothing was changed: " + err.Error()}
		return f
	}
	f.Status = ae.StatusCode
	if ae.StatusCode == http.StatusBadRequest {
		f.Status = http.StatusUnprocessableEntity
	}
	msg := ae.Message
	if msg == "" {
		msg = ae.Error()
	}
	for _, line := range strings.Split(msg, "\n") {
		if line = strings.TrimSpace(line); line == "" || problemsHeader.MatchString(line) {
			continue
		}
		// A section's refusal quotes the policy's problems, each after the
		// enforcer's file and line, which mean nothing to the form.
		if m := problemLine.FindStringSubmatch(line); m != nil {
			line = m[1]
		}
		field, _, _ := strings.Cut(line, ":")
		field, _, _ = strings.Cut(field, "[")
		if in, ok := inputOf(inputs, field); ok {
			f.Fields[in] = append(f.Fields[in], line)
		} else {
			f.Errors = append(f.Errors, line)
		}
	}
	return f
}

// The lines of a policy.Error: its header, then "FILE:LINE: FIELD: message".
var (
	problemsHeader = regexp.MustCompile(`^policy: \d+ problem\(s\):$`)
	// The enforcer's file name has spaces ("policy.yaml with the admin
	// API's tenants and plans").
	problemLine = regexp.MustCompile(`^.+?:\d+: (\S+: .*)$`)
)

// inputOf finds the input of field, or of the nearest dotted parent it
// has (tenants.x.limits.rpm.unit is the limits input's).
func inputOf(inputs map[string]string, field string) (string, bool) {
	for {
		if in, ok := inputs[field]; ok {
			return in, true
		}
		i := strings.LastIndexByte(field, '.')
		if i < 0 {
			return "", false
		}
		field = field[:i]
	}
}

// Value is what the user typed into input of form, when form is the one
// shown again; "" otherwise.
func (f formState) Value(form, input string) string {
	if f.Name != form {
		return ""
	}
	return f.Values.Get(input)
}

// Err is the refusal's messages about input of form.
func (f formState) Err(form, input string) string {
	if f.Name != form {
		return ""
	}
	return strings.Join(f.Fields[input], "; ")
}

// FormErrors are the refusal's messages of form that name no input.
func (f formState) FormErrors(form string) []string {
	if f.Name != form {
		return nil
	}
	return f.Errors
}

// Is reports whether form is the one shown again (a folded form opens).
func (f formState) Is(form string) bool { return f.Name != "" && f.Name == form }
