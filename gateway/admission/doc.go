// Package admission decides, before an LLM call is made, whether the rules
// that apply to it let it through.
package admission
