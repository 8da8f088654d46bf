// Package framing finds the events in a request body without decoding them:
// the elements of a JSON array ([SplitJSONArray]) or the lines of
// newline-delimited JSON ([SplitNDJSON]), so that each event can be decoded,
// and accepted or rejected, on its own while its neighbours go through.
//
// Framing tracks only strings and bracket nesting; judging the values is
// the decoders' job (package schemas/eventjson for usage events and
// CloudEvents). [EachElement] and [ValueEnd] let a decoder that finds an
// element's end by decoding it share the array walk instead of reading every
// byte twice; eventjson.BatchDecoder does that.
//
// Framing is hand-written for the same reason as the decoder: it touches
// every byte of every batch ingest accepts. It crosses strings from quote to
// quote with bytes.IndexByte and allocates nothing;
// BenchmarkSplitJSONArray1000 guards it, and `make bench` runs it with the
// rest. Fuzz targets hold it to encoding/json's framing of the same arrays.
//
// Broken framing is a [*schemas.SyntaxError] with the byte offset in the
// body.
package framing
