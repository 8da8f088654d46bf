package authz

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// AuthorizationService is the gRPC service name Envoy calls, and the name
// the health service answers for besides "".
const AuthorizationService = "envoy.service.auth.v3.Authorization"

// grpcAuthz is the gRPC front end: Envoy's ext_authz Check, answered with
// the HTTP endpoint's decision (Server.decide).
type grpcAuthz struct {
	authv3.UnimplementedAuthorizationServer
	s *Server
}

// Check decides the HTTP request Envoy describes. A denied request is an
// answer (DeniedHttpResponse with the status, headers and OpenAI body the
// HTTP endpoint would give), not a gRPC error: an error means "Sluice could
// not decide", which Envoy answers with status_on_error or lets through
// with failure_mode_allow.
func (g grpcAuthz) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	hr := req.GetAttributes().GetRequest().GetHttp()
	if hr == nil {
		return nil, status.Error(codes.InvalidArgument, "the CheckRequest has no attributes.request.http: Sluice answers Envoy's HTTP ext_authz filter (envoy.filters.http.ext_authz), not the network filter")
	}
	v := g.s.decide(ctx, g.s.grpcRequest(req.GetAttributes().GetContextExtensions(), hr), transportGRPC)
	return g.s.checkResponse(&v), nil
}

// grpcRequest reads Envoy's description of the request. The route's
// context extensions (ExtAuthzPerRoute.check_settings.context_extensions),
// keyed by a header's name in lower case, win over the request's headers:
// the route sets them, the client cannot. The estimate headers are read
// from the context extensions only, unless grpc.trust_estimate_headers:
// Envoy's gRPC mode and Istio pass on whatever the client sent.
func (s *Server) grpcRequest(ext map[string]string, hr *authv3.AttributeContext_HttpRequest) request {
	hdr := hr.GetHeaders()
	if len(hdr) == 0 && hr.GetHeaderMap() != nil {
		hdr = rawHeaders(hr.GetHeaderMap())
	}
	headers := envoyHeaders{lower: s.lower, ext: ext, hdr: hdr}
	estimates := envoyHeaders{lower: s.lower, ext: ext}
	if s.cfg.GRPC.TrustEstimateHeaders {
		estimates.hdr = hdr
	}
	// Path is the request target as the client sent it, query included.
	endpoint, _, _ := strings.Cut(hr.GetPath(), "?")
	return request{headers: headers, estimates: estimates, endpoint: endpoint}
}

// rawHeaders is the header map Envoy sends with encode_raw_headers: the
// values of a repeated header joined as Envoy joins them otherwise.
func rawHeaders(hm *corev3.HeaderMap) map[string]string {
	m := make(map[string]string, len(hm.GetHeaders()))
	for _, h := range hm.GetHeaders() {
		k := strings.ToLower(h.GetKey())
		v := string(h.GetRawValue())
		if v == "" {
			v = h.GetValue()
		}
		if old, ok := m[k]; ok {
			v = old + "," + v
		}
		m[k] = v
	}
	return m
}

// envoyHeaders looks a configured header name up in Envoy's maps, whose
// keys are lower case: the context extensions first, then the headers.
type envoyHeaders struct {
	lower    map[string]string // configured name -> lower case
	ext, hdr map[string]string
}

func (e envoyHeaders) Get(name string) string {
	k, ok := e.lower[name]
	if !ok {
		k = strings.ToLower(name)
	}
	if v, ok := e.ext[k]; ok {
		return v
	}
	return e.hdr[k]
}

// lowerNames maps each configured header name to its lower case, so a
// gRPC check looks its headers up without allocating.
func lowerNames(h Headers) map[string]string {
	m := map[string]string{}
	for _, n := range []string{h.Key, h.Tenant, h.KeyID, h.Model, h.User, h.Priority, h.URI, h.EstimatePromptTokens, h.EstimateCompletionTokens} {
		if n != "" {
			m[n] = strings.ToLower(n)
		}
	}
	return m
}

// checkResponse is the verdict in Envoy's terms. Allowed: status OK, the
// caller's tenant and key id set on the upstream request (replacing what
// the client sent in those headers) and the x-ratelimit-* headers added to
// the client's answer. Denied: the gRPC code matching the HTTP status, and
// a DeniedHttpResponse with the status, the refusal's headers and its
// OpenAI error body, which Envoy answers the client with.
func (s *Server) checkResponse(v *verdict) *authv3.CheckResponse {
	if v.allowed() {
		ok := &authv3.OkHttpResponse{Headers: []*corev3.HeaderValueOption{setHeader(s.lower[s.cfg.Headers.Tenant], v.call.tenant)}}
		if v.call.keyID != "" {
			ok.Headers = append(ok.Headers, setHeader(s.lower[s.cfg.Headers.KeyID], v.call.keyID))
		}
		if len(v.limits) > 0 {
			h := make(http.Header, 2*len(v.limits))
			for _, l := range v.limits {
				ratelimit.SetHeaders(h, l)
			}
			ok.ResponseHeadersToAdd = headerOptions(h)
		}
		return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.OK)}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: ok}}
	}
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(grpcCode(v.status)), Message: http.StatusText(v.status)},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(v.status)},
			Headers: headerOptions(v.header),
			Body:    string(v.body),
		}},
	}
}

// setHeader sets name to value, replacing any value the request had: the
// append action's zero value appends, which would let a client's own
// X-Sluice-Tenant travel beside the key's.
func setHeader(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: name, Value: value},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}

// headerOptions turns h into Envoy's header options, names in lower case,
// in a stable order; a repeated header's later values are appended.
func headerOptions(h http.Header) []*corev3.HeaderValueOption {
	out := make([]*corev3.HeaderValueOption, 0, len(h))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		name := strings.ToLower(k)
		for i, val := range h[k] {
			o := setHeader(name, val)
			if i > 0 {
				o.AppendAction = corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
			}
			out = append(out, o)
		}
	}
	return out
}

// grpcCode is the gRPC status code of a refusal with HTTP status st; Envoy
// denies on any code but OK and answers the DeniedHttpResponse's status,
// so the code only tells logs and traces what kind of refusal it was.
func grpcCode(st int) codes.Code {
	switch st {
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case http.StatusServiceUnavailable:
		return codes.Unavailable
	case http.StatusBadRequest:
		return codes.InvalidArgument
	default:
		return codes.PermissionDenied
	}
}

// grpcService is the gRPC server of a Server: the Authorization service
// and the gRPC health service, SERVING for "" and AuthorizationService
// until shutdown.
type grpcService struct {
	srv    *grpc.Server
	health *health.Server
}

// newGRPCService builds the gRPC server that answers s's checks.
func (s *Server) newGRPCService() *grpcService {
	srv := grpc.NewServer(
		// Envoy keeps its connection open and may ping it (a cluster's
		// http2_protocol_options.connection_keepalive); grpc-go's default
		// policy would answer pings more often than every 5 minutes with
		// GOAWAY too_many_pings.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	authv3.RegisterAuthorizationServer(srv, grpcAuthz{s: s})
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(AuthorizationService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	return &grpcService{srv: srv, health: hs}
}

// stop answers NOT_SERVING to health checks, then lets the checks in
// flight finish (GracefulStop) until ctx is done, and cuts the rest.
func (g *grpcService) stop(ctx context.Context) {
	g.health.Shutdown()
	done := make(chan struct{})
	go func() {
		g.srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		g.srv.Stop()
		<-done
	}
}
