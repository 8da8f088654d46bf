package authz

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpoptsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	// The typed configurations the shipped Envoy files name in "@type",
	// so protojson can resolve them (an unknown type fails the decode).
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
)

const (
	envoyGRPCFile = "../../deploy/envoy/sluice-ext-authz-grpc.yaml"
	envoyHTTPFile = "../../deploy/envoy/sluice-ext-authz.yaml"
	istioMeshFile = "../../deploy/istio/meshconfig.yaml"
	istioFile     = "../../deploy/istio/sluice-ext-authz.yaml"
	// grpcExamplePort is the gRPC port the examples and the docs use
	// (grpc.listen has no default: the service is off without it).
	grpcExamplePort = 8092
)

// decodeEnvoy decodes an Envoy static configuration into go-control-plane's
// Bootstrap as Envoy reads it: YAML as JSON through protojson, failing on
// an unknown field or an "@type" no Envoy API names; then it runs Envoy's
// validation rules (protoc-gen-validate) on it and on every typed
// configuration inside it.
func decodeEnvoy(t *testing.T, path string) *bootstrapv3.Bootstrap {
	t.Helper()
	var doc any
	if err := yaml.Unmarshal([]byte(readFile(t, path)), &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, &b); err != nil {
		t.Fatalf("%s is not an Envoy v3 bootstrap: %v", path, err)
	}
	validateDeep(t, path, &b)
	return &b
}

// validateDeep runs m's validation rules, and those of every Any inside it,
// unpacked (the rules of a message stop at an Any).
func validateDeep(t *testing.T, where string, m proto.Message) {
	t.Helper()
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			t.Errorf("%s: Envoy's validation rules refuse it: %v", where, err)
		}
	}
	var walk func(protoreflect.Message)
	walk = func(rm protoreflect.Message) {
		rm.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if fd.Kind() != protoreflect.MessageKind {
				return true
			}
			visit := func(mv protoreflect.Message) {
				if a, ok := mv.Interface().(*anypb.Any); ok {
					inner, err := a.UnmarshalNew()
					if err != nil {
						t.Errorf("%s: %s: %v", where, a.GetTypeUrl(), err)
						return
					}
					validateDeep(t, where+": "+a.GetTypeUrl(), inner)
					return
				}
				walk(mv)
			}
			switch {
			case fd.IsList():
				for i := 0; i < v.List().Len(); i++ {
					visit(v.List().Get(i).Message())
				}
			case fd.IsMap():
				if fd.MapValue().Kind() == protoreflect.MessageKind {
					v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { visit(mv.Message()); return true })
				}
			default:
				visit(v.Message())
			}
			return true
		})
	}
	walk(m.ProtoReflect())
}

// unpack decodes a typed configuration into m.
func unpack[M proto.Message](t *testing.T, a *anypb.Any, m M) M {
	t.Helper()
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatalf("%s: %v", a.GetTypeUrl(), err)
	}
	return m
}

// listMatches reports whether Envoy's ListStringMatcher matches s.
func listMatches(t *testing.T, l *matcherv3.ListStringMatcher, s string) bool {
	t.Helper()
	for _, p := range l.GetPatterns() {
		v := s
		if p.GetIgnoreCase() {
			v = strings.ToLower(v)
		}
		low := func(x string) string {
			if p.GetIgnoreCase() {
				return strings.ToLower(x)
			}
			return x
		}
		var ok bool
		switch m := p.GetMatchPattern().(type) {
		case *matcherv3.StringMatcher_Exact:
			ok = v == low(m.Exact)
		case *matcherv3.StringMatcher_Prefix:
			ok = strings.HasPrefix(v, low(m.Prefix))
		case *matcherv3.StringMatcher_Suffix:
			ok = strings.HasSuffix(v, low(m.Suffix))
		case *matcherv3.StringMatcher_Contains:
			ok = strings.Contains(v, low(m.Contains))
		case *matcherv3.StringMatcher_SafeRegex:
			ok = regexp.MustCompile(`^(?:` + m.SafeRegex.GetRegex() + `)$`).MatchString(s)
		default:
			t.Fatalf("a header pattern this test cannot evaluate: %v", p)
		}
		if ok {
			return true
		}
	}
	return false
}

// TestEnvoyExamplesDecodeAsEnvoysAPI: both shipped Envoy configurations,
// HTTP and gRPC mode, are Envoy v3 bootstraps that Envoy's own API types
// and validation rules accept.
func TestEnvoyExamplesDecodeAsEnvoysAPI(t *testing.T) {
	for _, f := range []string{envoyHTTPFile, envoyGRPCFile} {
		decodeEnvoy(t, f)
	}
}

// TestEnvoyGRPCExampleMatchesTheService checks deploy/envoy's gRPC-mode
// file against the service: the ext_authz filter asks the Authorization
// service over HTTP/2 on the examples' port, health-checks it with the
// name the gRPC health service answers, refuses with 503 when Sluice is
// away, sends the key, model and priority headers and never the client's
// estimates; and each route's context extensions are read by the service
// as the estimates (and only names the service reads).
func TestEnvoyGRPCExampleMatchesTheService(t *testing.T) {
	b := decodeEnvoy(t, envoyGRPCFile)
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	hcm := unpack(t, b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), &hcmv3.HttpConnectionManager{})
	filters := hcm.GetHttpFilters()
	if len(filters) < 2 || filters[0].GetName() != "envoy.filters.http.ext_authz" || filters[len(filters)-1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("want ext_authz first and the router last: %v", filters)
	}
	ea := unpack(t, filters[0].GetTypedConfig(), &extauthzv3.ExtAuthz{})

	// The service, over HTTP/2, health-checked.
	c := clusters[ea.GetGrpcService().GetEnvoyGrpc().GetClusterName()]
	if c == nil {
		t.Fatalf("ext_authz asks cluster %q, which the file does not define", ea.GetGrpcService().GetEnvoyGrpc().GetClusterName())
	}
	opts, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok || unpack(t, opts, &httpoptsv3.HttpProtocolOptions{}).GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Fatalf("cluster %s does not speak HTTP/2, which gRPC needs", c.GetName())
	}
	port := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
	if port != grpcExamplePort {
		t.Errorf("Envoy asks port %d; the docs' grpc.listen is port %d", port, grpcExamplePort)
	}
	if hc := c.GetHealthChecks(); len(hc) == 0 || hc[0].GetGrpcHealthCheck().GetServiceName() != AuthorizationService {
		t.Errorf("cluster %s is not health-checked over gRPC for %s: %v", c.GetName(), AuthorizationService, hc)
	}
	if ea.GetTransportApiVersion() != corev3.ApiVersion_V3 || ea.GetFailureModeAllow() || ea.GetStatusOnError().GetCode() != 503 || ea.GetGrpcService().GetTimeout() == nil {
		t.Errorf("ext_authz: want transport V3, failure_mode_allow false, status_on_error 503 and a timeout: %v", ea)
	}

	// The headers the check gets.
	d := DefaultConfig()
	sent := func(h string) bool {
		h = strings.ToLower(h)
		return (ea.GetAllowedHeaders() == nil || listMatches(t, ea.GetAllowedHeaders(), h)) && !listMatches(t, ea.GetDisallowedHeaders(), h)
	}
	for _, h := range []string{d.Headers.Key, d.Headers.Model, d.Headers.Priority} {
		if !sent(h) {
			t.Errorf("Envoy does not send %s, which the check reads", h)
		}
	}
	for _, h := range []string{d.Headers.EstimatePromptTokens, d.Headers.EstimateCompletionTokens} {
		if sent(h) {
			t.Errorf("Envoy sends the client's %s to the check: estimates come from the routes", h)
		}
	}

	// Each route's context extensions, read by the service itself.
	adm := &fakeAdmitter{}
	s, err := NewServer(d, Deps{Admitter: adm, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, n := range lowerNames(d.Headers) {
		known[n] = true
	}
	routes := 0
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			routes++
			per, ok := r.GetTypedPerFilterConfig()["envoy.filters.http.ext_authz"]
			if !ok {
				t.Errorf("route %s sets no estimates for the check (ExtAuthzPerRoute)", r.GetMatch().GetPrefix())
				continue
			}
			ext := unpack(t, per, &extauthzv3.ExtAuthzPerRoute{}).GetCheckSettings().GetContextExtensions()
			for k := range ext {
				if !known[k] {
					t.Errorf("route %s: context extension %q is no header the service reads (lower case: %v)", r.GetMatch().GetPrefix(), k, known)
				}
			}
			prompt, err1 := strconv.ParseInt(ext[strings.ToLower(d.Headers.EstimatePromptTokens)], 10, 64)
			completion, err2 := strconv.ParseInt(ext[strings.ToLower(d.Headers.EstimateCompletionTokens)], 10, 64)
			if err1 != nil || err2 != nil {
				t.Errorf("route %s: estimates %v are not both set as whole numbers", r.GetMatch().GetPrefix(), ext)
				continue
			}
			// The client's own estimate headers lose to the route's.
			v := s.decide(context.Background(), s.grpcRequest(ext, &authv3.AttributeContext_HttpRequest{Path: r.GetMatch().GetPrefix() + "x",
				Headers: map[string]string{"x-sluice-tenant": "acme", "x-sluice-estimate-prompt-tokens": "1", "x-sluice-estimate-completion-tokens": "1"}}), transportGRPC)
			got := adm.last(t)
			if !v.allowed() || got.EstimatePrompt != prompt || got.EstimateCompletion != completion {
				t.Errorf("route %s: the service answered %d and debited %d+%d, want 200 and the route's %d+%d: %s",
					r.GetMatch().GetPrefix(), v.status, got.EstimatePrompt, got.EstimateCompletion, prompt, completion, v.body)
			}
		}
	}
	if routes == 0 {
		t.Fatal("no routes")
	}

	// The docs run the service on the port Envoy asks.
	if doc := readFile(t, "../../docs/forward-auth.md"); !strings.Contains(doc, "grpc: {listen: 0.0.0.0:"+strconv.Itoa(grpcExamplePort)+"}") {
		t.Errorf("docs/forward-auth.md does not show grpc: {listen: 0.0.0.0:%d}", grpcExamplePort)
	}
}

// TestIstioExampleMatchesTheService checks deploy/istio against itself and
// the service: the AuthorizationPolicy is CUSTOM with the provider the
// mesh configuration declares; the provider is the gRPC one, on the
// Service's gRPC port (the examples' port), fails closed with 503; and the
// Service's port is carried as gRPC.
func TestIstioExampleMatchesTheService(t *testing.T) {
	type provider struct {
		Name string `yaml:"name"`
		Grpc *struct {
			Service       string `yaml:"service"`
			Port          int    `yaml:"port"`
			Timeout       string `yaml:"timeout"`
			FailOpen      bool   `yaml:"failOpen"`
			StatusOnError string `yaml:"statusOnError"`
		} `yaml:"envoyExtAuthzGrpc"`
	}
	var mesh struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Spec       struct {
			MeshConfig struct {
				ExtensionProviders []provider `yaml:"extensionProviders"`
			} `yaml:"meshConfig"`
		} `yaml:"spec"`
	}
	dec := yaml.NewDecoder(strings.NewReader(readFile(t, istioMeshFile)))
	dec.KnownFields(true)
	if err := dec.Decode(&mesh); err != nil {
		t.Fatalf("%s: %v", istioMeshFile, err)
	}
	if mesh.APIVersion != "install.istio.io/v1alpha1" || mesh.Kind != "IstioOperator" || len(mesh.Spec.MeshConfig.ExtensionProviders) != 1 {
		t.Fatalf("%s: want one extension provider in an IstioOperator: %+v", istioMeshFile, mesh)
	}
	p := mesh.Spec.MeshConfig.ExtensionProviders[0]
	if p.Grpc == nil {
		t.Fatalf("provider %s is not envoyExtAuthzGrpc", p.Name)
	}

	var policy struct {
		Metadata struct{ Name, Namespace string } `yaml:"metadata"`
		Spec     struct {
			Action   string `yaml:"action"`
			Provider struct {
				Name string `yaml:"name"`
			} `yaml:"provider"`
			Rules []any `yaml:"rules"`
		} `yaml:"spec"`
	}
	var svc struct {
		Metadata struct{ Name, Namespace string } `yaml:"metadata"`
		Spec     struct {
			Ports []struct {
				Name        string `yaml:"name"`
				AppProtocol string `yaml:"appProtocol"`
				Port        int    `yaml:"port"`
				TargetPort  int    `yaml:"targetPort"`
			} `yaml:"ports"`
		} `yaml:"spec"`
	}
	docs := yaml.NewDecoder(strings.NewReader(readFile(t, istioFile)))
	for {
		var head struct {
			Kind string `yaml:"kind"`
		}
		var node yaml.Node
		if err := docs.Decode(&node); err != nil {
			break
		}
		if err := node.Decode(&head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "AuthorizationPolicy":
			if err := node.Decode(&policy); err != nil {
				t.Fatal(err)
			}
		case "Service":
			if err := node.Decode(&svc); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s: unexpected kind %q", istioFile, head.Kind)
		}
	}
	if policy.Spec.Action != "CUSTOM" || policy.Spec.Provider.Name != p.Name || len(policy.Spec.Rules) == 0 {
		t.Errorf("the AuthorizationPolicy is %s with provider %q and %d rules; want CUSTOM, provider %q and rules",
			policy.Spec.Action, policy.Spec.Provider.Name, len(policy.Spec.Rules), p.Name)
	}
	if want := svc.Metadata.Name + "." + svc.Metadata.Namespace + ".svc.cluster.local"; p.Grpc.Service != want {
		t.Errorf("the provider asks %s; the Service is %s", p.Grpc.Service, want)
	}
	grpcPort := false
	for _, sp := range svc.Spec.Ports {
		if sp.Port == p.Grpc.Port {
			grpcPort = (sp.AppProtocol == "grpc" || strings.HasPrefix(sp.Name, "grpc")) && sp.TargetPort == grpcExamplePort
		}
	}
	if !grpcPort || p.Grpc.Port != grpcExamplePort {
		t.Errorf("the provider asks port %d: want the Service's gRPC port, targeting the examples' grpc.listen port %d: %+v", p.Grpc.Port, grpcExamplePort, svc.Spec.Ports)
	}
	if p.Grpc.FailOpen || p.Grpc.StatusOnError != "503" || p.Grpc.Timeout == "" {
		t.Errorf("provider: want failOpen false, statusOnError 503 and a timeout: %+v", *p.Grpc)
	}
}

// TestEnvoyHTTPExampleStripsClientEstimates plays the shipped HTTP-mode
// Envoy configuration's header handling on a client that sends its own
// estimate headers (0, to turn a token limit into a request limit): the
// header_mutation filter runs before ext_authz, each route overwrites or
// removes both estimate headers, and what ext_authz then forwards makes
// the service debit the route's estimate or its own default — never the
// client's.
func TestEnvoyHTTPExampleStripsClientEstimates(t *testing.T) {
	b := decodeEnvoy(t, envoyHTTPFile)
	hcm := unpack(t, b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), &hcmv3.HttpConnectionManager{})
	order := map[string]int{}
	for i, f := range hcm.GetHttpFilters() {
		order[f.GetName()] = i + 1
	}
	if order["envoy.filters.http.header_mutation"] == 0 || order["envoy.filters.http.header_mutation"] > order["envoy.filters.http.ext_authz"] {
		t.Fatalf("the header_mutation filter must run before ext_authz: %v", order)
	}
	ea := unpack(t, hcm.GetHttpFilters()[order["envoy.filters.http.ext_authz"]-1].GetTypedConfig(), &extauthzv3.ExtAuthz{})
	d := DefaultConfig()
	d.DefaultPromptTokens, d.DefaultCompletionTokens = 700, 300
	adm := &fakeAdmitter{}
	s, err := NewServer(d, Deps{Admitter: adm, Keys: testKeys(t), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	estimates := []string{strings.ToLower(d.Headers.EstimatePromptTokens), strings.ToLower(d.Headers.EstimateCompletionTokens)}
	routes := 0
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			routes++
			prefix := r.GetMatch().GetPrefix()
			client := map[string]string{"authorization": "Bearer sk-acme", "x-sluice-model": "gpt-4o", estimates[0]: "0", estimates[1]: "0"}
			per, ok := r.GetTypedPerFilterConfig()["envoy.filters.http.header_mutation"]
			if !ok {
				t.Errorf("route %s: no header_mutation, so the client's estimates reach the check", prefix)
				continue
			}
			want := map[string]int64{estimates[0]: d.DefaultPromptTokens, estimates[1]: d.DefaultCompletionTokens}
			touched := map[string]bool{}
			for _, m := range unpack(t, per, &headermutationv3.HeaderMutationPerRoute{}).GetMutations().GetRequestMutations() {
				switch {
				case m.GetRemove() != "":
					delete(client, m.GetRemove())
					touched[m.GetRemove()] = true
				case m.GetAppend() != nil:
					h := m.GetAppend().GetHeader()
					if slices.Contains(estimates, h.GetKey()) && m.GetAppend().GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
						t.Errorf("route %s: %s is appended beside the client's, not overwritten", prefix, h.GetKey())
					}
					client[h.GetKey()] = h.GetValue()
					touched[h.GetKey()] = true
					if v, err := strconv.ParseInt(h.GetValue(), 10, 64); err == nil {
						want[h.GetKey()] = v
					}
				}
			}
			for _, e := range estimates {
				if !touched[e] {
					t.Errorf("route %s leaves the client's %s as it came", prefix, e)
				}
			}
			// What ext_authz forwards of the request to the service.
			req := httptest.NewRequest(http.MethodPost, ea.GetHttpService().GetPathPrefix()+prefix+"x", nil)
			for k, v := range client {
				if k == "authorization" || listMatches(t, ea.GetAllowedHeaders(), k) {
					req.Header.Set(k, v)
				}
			}
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			got := adm.last(t)
			if rec.Code != http.StatusOK || got.EstimatePrompt != want[estimates[0]] || got.EstimateCompletion != want[estimates[1]] {
				t.Errorf("route %s: %d, debited %d+%d; want 200 and %d+%d (the route's or the service's, not the client's 0)",
					prefix, rec.Code, got.EstimatePrompt, got.EstimateCompletion, want[estimates[0]], want[estimates[1]])
			}
		}
	}
	if routes == 0 {
		t.Fatal("no routes")
	}
}
