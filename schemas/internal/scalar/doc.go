// Package scalar reads the JSON scalars of Sluice's formats the way the
// contract in package schemas defines them, for the two decoders that must
// agree on it: the usage event decoder in schemas/eventjson and the signal
// decoder in schemas.
//
//   - Integers are judged by value, like JSON Schema's "integer": 12, 12.0
//     and 1.2e1 are all twelve, 12.5 is not an integer, and the bound a
//     number exceeds is named in the problem.
//   - Timestamps are RFC 3339 of the shape [TimePattern], which the JSON
//     Schemas state too, returned in UTC.
//
// Every function returns the reason a value is wrong as a string, ready for
// a schemas.FieldError, or "" when it is fine: a decoder collects problems
// per field rather than stopping at the first error.
package scalar
