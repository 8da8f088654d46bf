// Package schematest holds what the tests of schemas and its subpackages
// share: corpora of good and bad documents with the verdict the Go decoders
// and the JSON Schemas must both reach, the compiled JSON Schemas, and
// helpers to compare events and inspect problems. Only tests import it.
package schematest
