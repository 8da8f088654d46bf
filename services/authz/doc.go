// Package authz is `sluice run authz`: a forward-auth endpoint that puts
// Sluice's enforcement in front of a proxy a team already runs — nginx
// (auth_request), Envoy (ext_authz, HTTP mode), Traefik (forwardAuth),
// Kong and APISIX (their forward-auth plugins). The proxy asks the
// endpoint before it forwards each request, with the request's headers and
// no body, and forwards only when the answer is 2xx; otherwise it answers
// the client with the endpoint's status, headers and body.
//
// With grpc.listen set it also serves Envoy's own gRPC authorization API
// (envoy.service.auth.v3.Authorization, go-control-plane's types) and the
// gRPC health service, for ext_authz in gRPC mode and Istio's CUSTOM
// authorization: the same decision (Server.decide) answered as an
// OkHttpResponse (the caller's tenant and key id set upstream, the
// rate-limit headers added for the client) or a DeniedHttpResponse (the
// status, headers and OpenAI body below). Over gRPC the route's context
// extensions win over the request's headers, and the estimates are read
// from them only (grpc.trust_estimate_headers reads the headers too).
//
// The endpoint answers, for the tenant, model and key the request names:
//
//   - 200 when the flags (sdk/go/checker, in memory) and admission
//     (sdk/go/admission through services/gateway's PolicyAdmitter, the
//     same Redis counters `sluice gateway` uses) let it through, with
//     OpenAI's x-ratelimit-* headers and the caller's tenant and key id
//     for the upstream;
//   - 401 for a missing or unknown key (or no tenant), 403 for a
//     blacklist or a model the key may not use, 429 with Retry-After for
//     a spent quota, a rate window or an admission limit, 503 for an open
//     breaker or a tenant that fails closed while Redis is away, 400 for
//     a header it cannot read — each with OpenAI's error body naming the
//     limit (sdk/go/middleware and sdk/go/admission write them), the
//     same JSON also in the X-Sluice-Error header for proxies that drop
//     the body of the authorization answer (nginx).
//
// Who the caller is comes either from a tenant key authenticated against
// `sluice gateway`'s keys file (services.authz.keys_file; the tenant, user
// and allowed models are the key's), or, without a keys file, from
// headers the proxy sets after authenticating the caller itself.
//
// Settlement. Forward-auth sees the request before the upstream call and
// never its answer, so admission cannot be corrected with the tokens the
// call used. The endpoint debits an estimate — the estimate headers when
// the proxy sets them, else default_prompt_tokens and
// default_completion_tokens — and never settles it: requests rules are
// exact, tokens rules count estimates. docs/forward-auth.md says what that
// means for a deployment and when `sluice gateway` (which settles every
// call with its real usage) is the better fit.
package authz
