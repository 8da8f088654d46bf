package helm

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	helmrelease "helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/ingest/apikey"
)

const (
	chartDir    = "sluice"
	releaseName = "prod"
	namespace   = "llm"
)

// scenario is one values combination the chart's README documents (a file
// of the chart's ci/ folder, on top of values.yaml) and the Secrets of the
// operator's own that it names, standing in for the cluster's.
type scenario struct {
	file     string
	existing map[string]map[string]string
}

var scenarios = []scenario{
	{file: "ci/minimal-values.yaml"},
	{file: "ci/full-values.yaml", existing: map[string]map[string]string{
		"anthropic-key": {"ANTHROPIC_API_KEY": "sk-ant-example"},
	}},
	{file: "ci/ha-values.yaml", existing: map[string]map[string]string{
		"clickhouse-credentials": {"password": "example"},
		"redis-credentials":      {"password": "example"},
		"sluice-signal-keys":     {"signal-keys": "# rotated by the platform team\nk9:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n"},
		"clickhouse-ca":          {"ca.crt": testCA()},
		"sluice-gateway-keys":    {"keys.yaml": "keys:\n  - {id: gw, sha256: 3f8a2ab6f0b4c4b1f37e4d9a3f2b66c3f3e0f4ac7cf5b0f0f0a6f3b0a8d5e2c1, tenants: [\"*\"]}\n"},
	}},
	{file: "ci/edge-values.yaml", existing: map[string]map[string]string{
		"redis-sentinel":     {"sentinel-password": "example", "redis-password": "example"},
		"sluice-tenant-keys": {"keys.yaml": "keys:\n  - {id: acme, sha256: 9d4f0f0b3c7a2e1d5b6a8c9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c, tenant: acme, models: [\"*\"]}\n"},
		// printf %s example-edge-usage-key | sha256sum = edge-values' usageKey.sha256
		"sluice-usage-key": {"key": "example-edge-usage-key"},
		"openai-key":       {"OPENAI_API_KEY": "sk-example"},
	}},
}

// -dump DIR writes each scenario's rendered templates to DIR/<scenario>/,
// as helm template would print them, for reading.
var dumpDir = flag.String("dump", "", "write each scenario's rendered templates under this folder")

// testCA is a self-signed CA certificate in PEM, standing in for an
// operator's (the binary parses a ca_file at start).
func testCA() string {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

var (
	chartOnce   sync.Once
	loadedChart *chart.Chart
	chartErr    error
)

func loadChart(t testing.TB) *chart.Chart {
	chartOnce.Do(func() { loadedChart, chartErr = loader.Load(chartDir) })
	if chartErr != nil {
		t.Fatalf("load chart: %v", chartErr)
	}
	return loadedChart
}

// capabilities is the oldest Kubernetes the chart supports (Chart.yaml's
// kubeVersion): the preStop sleep action is on by default from 1.30.
func capabilities(t testing.TB) *chartutil.Capabilities {
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion("v1.30.0")
	if err != nil {
		t.Fatal(err)
	}
	caps.KubeVersion = *kv
	return caps
}

// render renders the chart as `helm install` would, strictly: a template
// reading a value that does not exist fails instead of rendering nothing.
func render(t testing.TB, vals map[string]any) (map[string]string, error) {
	ch := loadChart(t)
	caps := capabilities(t)
	if ok := chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, caps.KubeVersion.String()); !ok {
		t.Fatalf("Chart.yaml kubeVersion %q excludes %s", ch.Metadata.KubeVersion, caps.KubeVersion.String())
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Engine{Strict: true}.Render(ch, rv)
}

func readValues(t testing.TB, file string) map[string]any {
	v, err := chartutil.ReadValuesFile(filepath.Join(chartDir, file))
	if err != nil {
		t.Fatal(err)
	}
	return v.AsMap()
}

// release is a rendered chart, every manifest decoded into its Go type.
type release struct {
	sc           scenario
	deployments  map[string]*appsv1.Deployment
	statefulSets map[string]*appsv1.StatefulSet
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]*corev1.Secret
	pdbs         map[string]*policyv1.PodDisruptionBudget
	hpas         map[string]*autoscalingv2.HorizontalPodAutoscaler
	jobs         map[string]*batchv1.Job
	accounts     map[string]*corev1.ServiceAccount
	hooks        map[string]*helmrelease.Hook // by kind/name
}

// decode splits the rendered templates as Helm does (hooks apart), and
// decodes each manifest strictly into Kubernetes' own type for its kind:
// a field the API does not have, or one given twice, fails.
func decode(t *testing.T, sc scenario, files map[string]string) *release {
	t.Helper()
	r := &release{sc: sc,
		deployments: map[string]*appsv1.Deployment{}, statefulSets: map[string]*appsv1.StatefulSet{},
		services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		pdbs: map[string]*policyv1.PodDisruptionBudget{}, hpas: map[string]*autoscalingv2.HorizontalPodAutoscaler{},
		jobs: map[string]*batchv1.Job{}, accounts: map[string]*corev1.ServiceAccount{}, hooks: map[string]*helmrelease.Hook{}}
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			if strings.TrimSpace(files[name]) == "" {
				t.Error("NOTES.txt renders empty")
			}
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		t.Fatalf("helm cannot sort the manifests: %v", err)
	}
	var docs []string
	for _, m := range manifests {
		docs = append(docs, m.Content)
	}
	for _, h := range hooks {
		r.hooks[h.Kind+"/"+h.Name] = h
		docs = append(docs, h.Manifest)
	}
	if len(docs) == 0 {
		t.Fatal("nothing rendered")
	}
	// Each kind the chart renders, decoded into Kubernetes' own type and
	// filed by name.
	sinks := map[string]func(name string) manifest{
		"apps/v1 Deployment":                     into(r.deployments),
		"apps/v1 StatefulSet":                    into(r.statefulSets),
		"v1 Service":                             into(r.services),
		"v1 ConfigMap":                           into(r.configMaps),
		"v1 Secret":                              into(r.secrets),
		"v1 ServiceAccount":                      into(r.accounts),
		"policy/v1 PodDisruptionBudget":          into(r.pdbs),
		"autoscaling/v2 HorizontalPodAutoscaler": into(r.hpas),
		"batch/v1 Job":                           into(r.jobs),
	}
	seen := map[string]bool{}
	for _, doc := range docs {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("manifest is not YAML: %v\n%s", err, doc)
		}
		key := head.APIVersion + " " + head.Kind + " " + head.Metadata.Name
		if seen[key] {
			t.Errorf("%s rendered twice", key)
		}
		seen[key] = true
		file, ok := sinks[head.APIVersion+" "+head.Kind]
		if !ok {
			t.Errorf("%s: a kind this test does not decode; add its Go type", key)
			continue
		}
		obj := file(head.Metadata.Name)
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Errorf("%s does not decode strictly into its Kubernetes type: %v\n%s", key, err, doc)
			continue
		}
		for _, e := range validation.IsDNS1123Subdomain(obj.GetName()) {
			t.Errorf("%s: name: %s", key, e)
		}
		if head.Kind == "Service" {
			for _, e := range validation.IsDNS1035Label(obj.GetName()) {
				t.Errorf("%s: a Service name must be a DNS-1035 label: %s", key, e)
			}
		}
		for k, v := range obj.GetLabels() {
			for _, e := range validation.IsQualifiedName(k) {
				t.Errorf("%s: label %s: %s", key, k, e)
			}
			for _, e := range validation.IsValidLabelValue(v) {
				t.Errorf("%s: label %s=%q: %s", key, k, v, e)
			}
		}
	}
	return r
}

// manifest is what the test reads of every decoded object.
type manifest interface {
	GetName() string
	GetLabels() map[string]string
}

// into returns a function that files a new object of one kind under its
// name in byName, for its manifest to be decoded into.
func into[T any, P interface {
	*T
	manifest
}](byName map[string]P) func(name string) manifest {
	return func(name string) manifest {
		o := P(new(T))
		byName[name] = o
		return o
	}
}

// workload is a Deployment's or StatefulSet's pods.
type workload struct {
	name, component string
	kind            string
	replicas        *int32
	selector        *metav1.LabelSelector
	pod             corev1.PodTemplateSpec
}

func (r *release) workloads() []workload {
	var out []workload
	for n, d := range r.deployments {
		out = append(out, workload{name: n, kind: "Deployment", component: d.Spec.Template.Labels["app.kubernetes.io/component"], replicas: d.Spec.Replicas, selector: d.Spec.Selector, pod: d.Spec.Template})
	}
	for n, s := range r.statefulSets {
		out = append(out, workload{name: n, kind: "StatefulSet", component: s.Spec.Template.Labels["app.kubernetes.io/component"], replicas: s.Spec.Replicas, selector: s.Spec.Selector, pod: s.Spec.Template})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// podNames are the names the workload's pods get: a StatefulSet's are
// stable (name-0, name-1, …), a Deployment's carry a hash.
func (w workload) podNames(n int) []string {
	var out []string
	for i := range n {
		if w.kind == "StatefulSet" {
			out = append(out, fmt.Sprintf("%s-%d", w.name, i))
		} else {
			out = append(out, fmt.Sprintf("%s-5d8f7c9b4-%05d", w.name, i))
		}
	}
	return out
}

// pod is one container's view of the chart: its files laid out under a
// temporary root, its environment and arguments, the configuration the
// binary loads from them.
type pod struct {
	root    string
	env     map[string]string
	args    []string
	cfg     sluiceconfig.Config
	names   []string
	rewrite *strings.Replacer
}

// host turns a path of the container into the file laid out for it.
func (p *pod) host(path string) string { return p.rewrite.Replace(path) }

// mount lays out the container's volumes under a temporary root — the
// ConfigMaps and Secrets the release renders, and the operator's own
// Secrets the scenario names — and resolves its environment; then loads
// its configuration from its arguments as the binary does.
func (r *release) mount(t *testing.T, what string, spec corev1.PodSpec, c corev1.Container, podName string) *pod {
	t.Helper()
	root := t.TempDir()
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	var mounts []string
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			t.Fatalf("%s: mounts volume %s, which the pod does not have", what, m.Name)
		}
		if m.SubPath != "" {
			t.Errorf("%s: mount %s uses subPath, which Kubernetes never updates: the policy and keys files would not reload", what, m.Name)
		}
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mounts = append(mounts, m.MountPath)
		switch {
		case v.ConfigMap != nil:
			cm := r.configMaps[v.ConfigMap.Name]
			if cm == nil {
				t.Fatalf("%s: volume %s names ConfigMap %s, which the release does not render", what, v.Name, v.ConfigMap.Name)
			}
			for k, val := range cm.Data {
				r.write(t, dir, k, []byte(val))
			}
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if src.Secret == nil {
					t.Fatalf("%s: projected volume %s has a source other than a Secret", what, v.Name)
				}
				data := r.secretData(t, what, src.Secret.Name)
				if len(src.Secret.Items) == 0 {
					t.Errorf("%s: projected Secret %s without items mounts every key of it", what, src.Secret.Name)
				}
				for _, it := range src.Secret.Items {
					val, ok := data[it.Key]
					if !ok {
						t.Fatalf("%s: volume %s wants key %s of Secret %s, which has %v", what, v.Name, it.Key, src.Secret.Name, keys(data))
					}
					if _, err := os.Stat(filepath.Join(dir, it.Path)); err == nil {
						t.Errorf("%s: volume %s projects %s twice", what, v.Name, it.Path)
					}
					r.write(t, dir, it.Path, val)
				}
			}
		case v.Secret != nil:
			data := r.secretData(t, what, v.Secret.SecretName)
			items := v.Secret.Items
			if len(items) == 0 {
				for _, k := range keys(data) {
					items = append(items, corev1.KeyToPath{Key: k, Path: k})
				}
			}
			for _, it := range items {
				val, ok := data[it.Key]
				if !ok {
					t.Fatalf("%s: volume %s wants key %s of Secret %s, which has %v", what, v.Name, it.Key, v.Secret.SecretName, keys(data))
				}
				r.write(t, dir, it.Path, val)
			}
		case v.EmptyDir != nil:
		default:
			t.Fatalf("%s: volume %s is of a kind this test does not lay out", what, v.Name)
		}
	}
	// Longest mount first, in one pass: a path of the container becomes
	// its file under root.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	var pairs []string
	for _, m := range mounts {
		pairs = append(pairs, m+"/", filepath.Join(root, m)+"/")
	}
	p := &pod{root: root, rewrite: strings.NewReplacer(pairs...), env: map[string]string{}}
	// The configuration files hold paths of the container too.
	for _, m := range mounts {
		_ = filepath.WalkDir(filepath.Join(root, m), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(path, []byte(p.host(string(b))), 0o644)
		})
	}
	for _, ef := range c.EnvFrom {
		if ef.SecretRef == nil {
			t.Fatalf("%s: envFrom other than a Secret", what)
		}
		for k, v := range r.secretData(t, what, ef.SecretRef.Name) {
			p.env[k] = string(v)
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			p.env[e.Name] = p.host(e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			p.env[e.Name] = podName
		case e.ValueFrom.SecretKeyRef != nil:
			v, ok := r.secretData(t, what, e.ValueFrom.SecretKeyRef.Name)[e.ValueFrom.SecretKeyRef.Key]
			if !ok {
				t.Fatalf("%s: env %s: Secret %s has no key %s", what, e.Name, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
			}
			p.env[e.Name] = string(v)
		default:
			t.Fatalf("%s: env %s comes from a source this test does not resolve", what, e.Name)
		}
	}
	known := knownEnv(t)
	for k := range p.env {
		if strings.HasPrefix(k, "SLUICE_") && !known[k] {
			t.Errorf("%s: sets %s, which sluice does not read (docs/configuration.md)", what, k)
		}
	}
	if len(c.Command) != 0 {
		t.Errorf("%s: command %v replaces the image's entrypoint /sluice", what, c.Command)
	}
	if len(c.Args) == 0 {
		t.Fatalf("%s: no arguments", what)
	}
	args := make([]string, len(c.Args))
	for i, a := range c.Args {
		args[i] = p.host(a)
	}
	p.args = c.Args
	cfg, names, err := loadBinaryConfig(args[1:], p.env)
	if err != nil {
		t.Fatalf("%s: sluice %s does not load the configuration the chart gives it: %v\nsluice.yaml:\n%s", what, c.Args[0], err, r.configMapText(spec))
	}
	p.cfg, p.names = cfg, names
	// Every file a setting the process reads names is one the chart
	// mounted: the shared sections', and its own services' (another
	// service's section is not read).
	for _, f := range fileSettings(reflect.ValueOf(cfg), "") {
		if svc, ok := strings.CutPrefix(f[0], "services."); ok {
			if name, _, _ := strings.Cut(svc, "."); !slices.Contains(names, name) {
				continue
			}
		}
		if !strings.HasPrefix(f[1], root+"/") {
			t.Errorf("%s: %s names %s, which no volume of the pod holds", what, f[0], f[1])
		} else if _, err := os.Stat(f[1]); err != nil {
			t.Errorf("%s: %s: %v", what, f[0], err)
		}
	}
	return p
}

// fileSettings lists the settings of v that name a file or folder (their
// YAML name is file, *_file or *_dir) and are set: [path, value] pairs.
func fileSettings(v reflect.Value, prefix string) [][2]string {
	var out [][2]string
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			p := prefix
			if name != "" && name != "-" {
				if p != "" {
					p += "."
				}
				p += name
			}
			if f.Type.Kind() == reflect.String && (name == "file" || strings.HasSuffix(name, "_file") || strings.HasSuffix(name, "_dir")) {
				if s := v.Field(i).String(); s != "" {
					out = append(out, [2]string{p, s})
				}
				continue
			}
			out = append(out, fileSettings(v.Field(i), p)...)
		}
	case reflect.Pointer:
		if !v.IsNil() {
			out = append(out, fileSettings(v.Elem(), prefix)...)
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			out = append(out, fileSettings(v.MapIndex(k), prefix+"."+fmt.Sprint(k.Interface()))...)
		}
	case reflect.Slice:
		for i := range v.Len() {
			out = append(out, fileSettings(v.Index(i), fmt.Sprintf("%s[%d]", prefix, i))...)
		}
	}
	return out
}

func (r *release) write(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// secretData is a Secret's content: the release's, or one the operator
// made (the scenario's).
func (r *release) secretData(t *testing.T, what, name string) map[string][]byte {
	t.Helper()
	if s := r.secrets[name]; s != nil {
		out := map[string][]byte{}
		for k, v := range s.Data {
			out[k] = v
		}
		for k, v := range s.StringData {
			out[k] = []byte(v)
		}
		return out
	}
	if s, ok := r.sc.existing[name]; ok {
		out := map[string][]byte{}
		for k, v := range s {
			out[k] = []byte(v)
		}
		return out
	}
	t.Fatalf("%s: names Secret %s, which neither the release nor the scenario's operator makes", what, name)
	return nil
}

func (r *release) configMapText(spec corev1.PodSpec) string {
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && r.configMaps[v.ConfigMap.Name] != nil {
			return r.configMaps[v.ConfigMap.Name].Data["sluice.yaml"]
		}
	}
	return ""
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestChartRendersEveryDocumentedCombination renders each values file the
// README documents, decodes every manifest strictly, and holds what each
// pod gives the sluice binary to the binary's configuration.
func TestChartRendersEveryDocumentedCombination(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(strings.TrimSuffix(filepath.Base(sc.file), "-values.yaml"), func(t *testing.T) {
			files, err := render(t, readValues(t, sc.file))
			if err != nil {
				t.Fatalf("render %s: %v", sc.file, err)
			}
			if *dumpDir != "" {
				for name, text := range files {
					path := filepath.Join(*dumpDir, strings.TrimSuffix(filepath.Base(sc.file), "-values.yaml"), name)
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			r := decode(t, sc, files)
			r.check(t)
		})
	}
}

// The front ends serve /healthz and /readyz on their API port too (the
// readyz there fails from the moment a shutdown begins); the console only
// /healthz; the enforcer's admin API neither.
var apiPaths = map[string][]string{
	"ingest":  {"/healthz", "/readyz"},
	"gateway": {"/healthz", "/readyz"},
	"authz":   {"/healthz", "/readyz"},
	"console": {"/healthz"},
}

func (r *release) check(t *testing.T) {
	ws := r.workloads()
	if len(ws) == 0 {
		t.Fatal("no workload rendered")
	}
	byComponent := map[string]workload{}
	for _, w := range ws {
		if _, ok := sluiceconfig.Lookup(w.component); !ok {
			t.Errorf("%s: component %q is not a sluice service", w.name, w.component)
		}
		byComponent[w.component] = w
		r.checkWorkload(t, w)
	}
	r.checkServices(t, ws)
	r.checkBudgets(t, ws)
	r.checkAutoscalers(t, byComponent)
	r.checkMigrations(t, byComponent)
	r.checkWiring(t, byComponent)
}

func (r *release) checkWorkload(t *testing.T, w workload) {
	sel, err := metav1.LabelSelectorAsSelector(w.selector)
	if err != nil || sel.Empty() {
		t.Fatalf("%s: selector %v: %v", w.name, w.selector, err)
	}
	if !sel.Matches(labels.Set(w.pod.Labels)) {
		t.Errorf("%s: its selector %s does not select its own pods %v", w.name, sel, w.pod.Labels)
	}
	spec := w.pod.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want one", w.name, len(spec.Containers))
	}
	c := spec.Containers[0]
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: mounts a service account token; Sluice never calls the Kubernetes API", w.name)
	}
	if spec.ServiceAccountName != "" && spec.ServiceAccountName != "default" && r.accounts[spec.ServiceAccountName] == nil {
		t.Errorf("%s: service account %s is not rendered", w.name, spec.ServiceAccountName)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("%s: no CPU or memory request", w.name)
	}
	if !c.Resources.Limits.Cpu().IsZero() {
		t.Errorf("%s: a CPU limit throttles Go and lowers GOMAXPROCS; the chart sets none", w.name)
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: container is not read-only without privilege escalation", w.name)
	}
	replicas := 1
	if w.replicas != nil {
		replicas = int(*w.replicas)
	} else if h := r.hpas[w.name]; h != nil && h.Spec.MinReplicas != nil {
		replicas = int(*h.Spec.MinReplicas)
	}
	// Anti-affinity, when there is one, keeps apart this component's pods.
	if a := spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		terms := a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
		for _, wt := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, wt.PodAffinityTerm)
		}
		for _, term := range terms {
			s, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
			if err != nil || !s.Matches(labels.Set(w.pod.Labels)) || term.TopologyKey == "" {
				t.Errorf("%s: an anti-affinity term that does not keep its own pods apart: %+v", w.name, term)
			}
		}
	} else if replicas > 1 && w.component != "reconciler" {
		t.Errorf("%s: %d replicas without pod anti-affinity", w.name, replicas)
	}

	var ids []string
	for _, name := range w.podNames(replicas) {
		p := r.mount(t, w.name, spec, c, name)
		r.checkPod(t, w, c, p)
		if w.component == "enforcer" {
			ids = append(ids, p.cfg.Services.Enforcer.ReplicaID)
		}
	}
	if w.component == "enforcer" {
		if w.kind != "StatefulSet" {
			t.Errorf("%s: the enforcer's replica_id must survive a restart (its consumer group and lease are named by it): run it as a StatefulSet", w.name)
		}
		uniq := slices.Compact(slices.Sorted(slices.Values(ids)))
		if len(uniq) != len(ids) || slices.Contains(ids, "") {
			t.Errorf("%s: replica ids %q: each enforcer replica needs its own (services.enforcer.replica_id)", w.name, ids)
		}
	}
}

func listenPort(t *testing.T, what, setting, addr string) int32 {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s: %s %q: %v", what, setting, addr, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		t.Errorf("%s: %s %q listens on loopback: nothing outside the pod reaches it", what, setting, addr)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("%s: %s %q: %v", what, setting, addr, err)
	}
	return int32(n)
}

// apiListen is the service's own listener, if it has one.
func apiListen(cfg *sluiceconfig.Config, component string) (setting, addr string) {
	switch component {
	case "ingest":
		return "services.ingest.listen", cfg.Services.Ingest.Listen
	case "gateway":
		return "services.gateway.listen", cfg.Services.Gateway.Listen
	case "authz":
		return "services.authz.listen", cfg.Services.Authz.Listen
	case "console":
		return "services.console.listen", cfg.Services.Console.Listen
	case "enforcer":
		return "services.enforcer.admin.listen", cfg.Services.Enforcer.Admin.Listen
	}
	return "", ""
}

func (r *release) checkPod(t *testing.T, w workload, c corev1.Container, p *pod) {
	what := w.name
	if len(p.args) == 0 || p.args[0] != "run" {
		t.Fatalf("%s: runs %v, want sluice run", what, p.args)
	}
	if !slices.Equal(p.names, []string{w.component}) {
		t.Errorf("%s: runs services %v, want just %s", what, p.names, w.component)
	}
	if _, err := sluiceconfig.Choose(&p.cfg, p.names); err != nil {
		t.Errorf("%s: sluice run %v would refuse to start: %v", what, p.names, err)
	}
	if p.cfg.Embedded.Enabled {
		t.Errorf("%s: the development broker is on", what)
	}

	// Ports: ops.listen and the service's own listener are the container's
	// ports of those names, and nothing else is.
	ports := map[string]int32{}
	for _, cp := range c.Ports {
		ports[cp.Name] = cp.ContainerPort
	}
	opsPort := listenPort(t, what, "ops.listen", p.cfg.Ops.Listen)
	if ports["ops"] != opsPort {
		t.Errorf("%s: container port ops is %d, ops.listen is %s", what, ports["ops"], p.cfg.Ops.Listen)
	}
	apiName := "http"
	if w.component == "enforcer" {
		apiName = "admin"
	}
	setting, addr := apiListen(&p.cfg, w.component)
	var apiPort int32
	if addr != "" {
		apiPort = listenPort(t, what, setting, addr)
		if ports[apiName] != apiPort {
			t.Errorf("%s: container port %s is %d, %s is %s", what, apiName, ports[apiName], setting, addr)
		}
	}
	for name, n := range ports {
		if name != "ops" && (name != apiName || addr == "") {
			t.Errorf("%s: container port %s (%d) is no listener of the service", what, name, n)
		}
	}

	// Probes: /healthz (liveness, startup) and /readyz (readiness), on a
	// port that serves them.
	probe := func(kind string, pr *corev1.Probe, wantPath string) int32 {
		if pr == nil || pr.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", what, kind)
			return 0
		}
		port := pr.HTTPGet.Port.IntVal
		if pr.HTTPGet.Port.Type == intstr.String {
			var ok bool
			if port, ok = ports[pr.HTTPGet.Port.StrVal]; !ok {
				t.Errorf("%s: %s probe on port %q, which the container does not name", what, kind, pr.HTTPGet.Port.StrVal)
			}
		}
		if pr.HTTPGet.Path != wantPath {
			t.Errorf("%s: %s probe on %s, want %s", what, kind, pr.HTTPGet.Path, wantPath)
		}
		var served []string
		switch port {
		case opsPort:
			served = []string{"/healthz", "/readyz"}
		case apiPort:
			served = apiPaths[w.component]
		}
		if !slices.Contains(served, pr.HTTPGet.Path) {
			t.Errorf("%s: %s probe GET %s on port %d, which serves %v there", what, kind, pr.HTTPGet.Path, port, served)
		}
		return port
	}
	probe("liveness", c.LivenessProbe, "/healthz")
	probe("startup", c.StartupProbe, "/healthz")
	ready := probe("readiness", c.ReadinessProbe, "/readyz")
	if (w.component == "ingest" || w.component == "gateway" || w.component == "authz") && ready != apiPort {
		t.Errorf("%s: readiness on port %d; the %s's own /readyz on its API port (%d) turns not ready as its shutdown begins", what, ready, w.component, apiPort)
	}
	if sp := c.StartupProbe; sp != nil && time.Duration(sp.PeriodSeconds*sp.FailureThreshold)*time.Second < 2*time.Minute+10*time.Second {
		t.Errorf("%s: the startup probe gives up after %ds; the process waits up to 2 minutes for ClickHouse (and migrates) before it serves /healthz", what, sp.PeriodSeconds*sp.FailureThreshold)
	}

	// Graceful termination: the process's shutdown_timeout covers the
	// service's own (and what follows it), the grace period the preStop
	// sleep and the process's.
	budget := serviceBudget(&p.cfg, w.component)
	if p.cfg.ShutdownTimeout < budget {
		t.Errorf("%s: the process's shutdown_timeout %s cuts the %s's own shutdown (%s)", what, p.cfg.ShutdownTimeout, w.component, budget)
	}
	var sleep int64
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		if c.Lifecycle.PreStop.Sleep == nil {
			t.Errorf("%s: a preStop hook other than sleep (the image has no shell)", what)
		} else {
			sleep = c.Lifecycle.PreStop.Sleep.Seconds
		}
	}
	grace := w.pod.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace-sleep)*time.Second <= p.cfg.ShutdownTimeout {
		t.Errorf("%s: terminationGracePeriodSeconds %v is not above the preStop sleep (%ds) plus the process's shutdown_timeout (%s, the %s's %s within it)", what, grace, sleep, p.cfg.ShutdownTimeout, w.component, budget)
	}
	if w.component == "ingest" || w.component == "gateway" || w.component == "authz" {
		if sleep == 0 && w.component != "authz" {
			t.Errorf("%s: no preStop sleep: the Service keeps sending to the pod for a moment after SIGTERM", what)
		}
	}

	// The files the services read at start.
	cfg := &p.cfg
	if cfg.Policy.File == "" {
		t.Errorf("%s: no policy.file", what)
	} else if _, err := policy.Load(cfg.Policy.File); err != nil {
		t.Errorf("%s: policy.file: %v", what, err)
	}
	switch w.component {
	case "gateway", "authz":
		if cfg.TenantKeys.File != "" {
			b, err := os.ReadFile(cfg.TenantKeys.File)
			if err != nil {
				t.Errorf("%s: tenant_keys.file: %v", what, err)
			} else if _, err := frontend.ParseKeys(b); err != nil {
				t.Errorf("%s: tenant_keys.file: %v", what, err)
			}
		}
	case "ingest":
		if f := cfg.Services.Ingest.GatewayKeys.File; f != "" {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Errorf("%s: services.ingest.gateway_keys.file: %v", what, err)
			} else if _, err := apikey.Parse(b); err != nil {
				t.Errorf("%s: services.ingest.gateway_keys.file: %v", what, err)
			}
		}
	}
	// A gateway or console following the admin topic verifies its signed
	// records: it needs the brokers and the keys.
	follows := (w.component == "gateway" && cfg.Services.Gateway.FollowAdmin) || (w.component == "console" && cfg.Services.Console.FollowAdmin) ||
		(w.component == "ingest" && cfg.Services.Ingest.FollowAdmin)
	if svc, _ := sluiceconfig.Lookup(w.component); !svc.Signals && !follows && cfg.SignalAuth.KeyFile != "" {
		t.Errorf("%s: the signing keys are mounted into the %s, which neither signs nor verifies", what, w.component)
	}
	if follows && (cfg.SignalAuth.KeyFile == "" || len(cfg.Kafka.Brokers) == 0) {
		t.Errorf("%s: follows the admin topic without the signing keys (%q) or the brokers (%v) its records need", what, cfg.SignalAuth.KeyFile, cfg.Kafka.Brokers)
	}
	if w.component != "gateway" && w.component != "authz" && cfg.TenantKeys.File != "" {
		t.Errorf("%s: the tenant keys are mounted into the %s, which does not read them", what, w.component)
	}
	if w.component == "gateway" {
		pol, err := policy.Load(cfg.Policy.File)
		if err == nil {
			for _, n := range pol.UpstreamNames() {
				u, _ := pol.Upstream(n)
				if u.APIKeyEnv != "" && p.env[u.APIKeyEnv] == "" {
					t.Errorf("%s: upstream %s reads its key from %s, which the pod's environment does not have", what, n, u.APIKeyEnv)
				}
				if u.APIKeyFile != "" {
					if _, err := os.Stat(p.host(u.APIKeyFile)); err != nil {
						t.Errorf("%s: upstream %s reads its key from %s: %v", what, n, u.APIKeyFile, err)
					}
				}
			}
		}
	}
}

// serviceBudget is how long a service's own shutdown may take with cfg:
// the binary's own figure, and for a gateway running deferred tasks at
// least their drain.
func serviceBudget(cfg *sluiceconfig.Config, component string) time.Duration {
	svc, ok := sluiceconfig.Lookup(component)
	if !ok {
		return 0
	}
	b := svc.Shutdown(cfg)
	if g := cfg.Services.Gateway; component == "gateway" && g.Deferred.Enabled {
		b = max(b, g.Deferred.Drain)
	}
	return b
}

// checkServices: every Service selects one workload's pods and sends to
// ports they have; every workload has a Service.
func (r *release) checkServices(t *testing.T, ws []workload) {
	served := map[string]bool{}
	for name, svc := range r.services {
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		var hit []workload
		for _, w := range ws {
			if len(svc.Spec.Selector) > 0 && sel.Matches(labels.Set(w.pod.Labels)) {
				hit = append(hit, w)
			}
		}
		if len(hit) != 1 {
			t.Errorf("Service %s selects %d workloads, want one", name, len(hit))
			continue
		}
		served[hit[0].name] = true
		for _, sp := range svc.Spec.Ports {
			if _, ok := containerPort(hit[0], sp.TargetPort); !ok {
				t.Errorf("Service %s port %s sends to %s, which %s's container does not have", name, sp.Name, sp.TargetPort.String(), hit[0].name)
			}
		}
	}
	for _, w := range ws {
		if !served[w.name] {
			t.Errorf("%s has no Service", w.name)
		}
		if s := r.statefulSets[w.name]; s != nil {
			h := r.services[s.Spec.ServiceName]
			if h == nil || h.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Errorf("%s: its serviceName %s is not a headless Service of the release", w.name, s.Spec.ServiceName)
			}
		}
	}
}

func containerPort(w workload, target intstr.IntOrString) (int32, bool) {
	for _, cp := range w.pod.Spec.Containers[0].Ports {
		if (target.Type == intstr.String && cp.Name == target.StrVal) || (target.Type == intstr.Int && cp.ContainerPort == target.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// resolve follows an in-cluster URL the chart gives a service to the
// workload and container port it reaches.
func (r *release) resolve(t *testing.T, ws map[string]workload, raw string) (workload, string, bool) {
	u, err := url.Parse(raw)
	if err != nil {
		t.Errorf("URL %q: %v", raw, err)
		return workload{}, "", false
	}
	host, port := u.Hostname(), u.Port()
	name, ok := strings.CutSuffix(host, "."+namespace+".svc")
	svc := r.services[name]
	if !ok || svc == nil {
		return workload{}, "", false
	}
	for _, sp := range svc.Spec.Ports {
		if strconv.Itoa(int(sp.Port)) != port {
			continue
		}
		for _, w := range ws {
			if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.pod.Labels)) {
				for _, cp := range w.pod.Spec.Containers[0].Ports {
					if (sp.TargetPort.Type == intstr.String && cp.Name == sp.TargetPort.StrVal) || cp.ContainerPort == sp.TargetPort.IntVal {
						return w, cp.Name, true
					}
				}
			}
		}
	}
	t.Errorf("URL %s: Service %s has no port %s reaching a pod", raw, name, port)
	return workload{}, "", false
}

// checkWiring follows what one service tells of another: the console's
// admin API and metrics, the front ends' ingest and key.
func (r *release) checkWiring(t *testing.T, ws map[string]workload) {
	cfgOf := func(component string) *sluiceconfig.Config {
		w := ws[component]
		p := r.mount(t, w.name, w.pod.Spec, w.pod.Spec.Containers[0], w.podNames(1)[0])
		return &p.cfg
	}
	if w, ok := ws["console"]; ok {
		cfg := cfgOf("console")
		if tw, port, ok := r.resolve(t, ws, cfg.Services.Console.AdminURL); ok && (tw.component != "enforcer" || port != "admin") {
			t.Errorf("%s: services.console.admin_url %s reaches %s port %s, not the enforcer's admin API", w.name, cfg.Services.Console.AdminURL, tw.name, port)
		}
		if _, inRelease := ws["enforcer"]; inRelease && !strings.Contains(cfg.Services.Console.AdminURL, ".svc:") {
			t.Errorf("%s: the console acts through %s, not this release's enforcer", w.name, cfg.Services.Console.AdminURL)
		}
		for _, m := range cfg.Services.Console.MetricsURLs {
			tw, port, ok := r.resolve(t, ws, m)
			if !ok || port != "ops" || !strings.HasSuffix(m, "/metrics") {
				t.Errorf("%s: services.console.metrics_urls %s is not a pipeline service's /metrics (reaches %s port %s)", w.name, m, tw.name, port)
			}
		}
	}
	ingestKeys := func() *apikey.Set {
		if _, ok := ws["ingest"]; !ok {
			return nil
		}
		b, err := os.ReadFile(cfgOf("ingest").Services.Ingest.GatewayKeys.File)
		if err != nil {
			t.Fatal(err)
		}
		s, err := apikey.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()
	for _, fe := range []string{"gateway", "authz"} {
		w, ok := ws[fe]
		if !ok {
			continue
		}
		p := r.mount(t, w.name, w.pod.Spec, w.pod.Spec.Containers[0], w.podNames(1)[0])
		sink := p.cfg.Services.Gateway.Usage.EventSink
		if fe == "authz" {
			sink = p.cfg.Services.Authz.Usage
		}
		if sink.Sink != "ingest" {
			continue
		}
		key, err := frontend.Secret("ingest_api_key_env", p.host(sink.IngestAPIKeyEnv), "ingest_api_key_file", sink.IngestAPIKeyFile)
		if err != nil || key == "" {
			t.Errorf("%s: the key it sends usage to ingest with: %v", w.name, err)
			continue
		}
		if ingestKeys == nil {
			if strings.Contains(sink.IngestURL, ".svc:") {
				t.Errorf("%s: sends usage to %s, but this release runs no ingest", w.name, sink.IngestURL)
			}
			continue
		}
		tw, port, ok := r.resolve(t, ws, sink.IngestURL)
		if !ok || tw.component != "ingest" || port != "http" {
			t.Errorf("%s: usage.ingest_url %s does not reach this release's ingest API", w.name, sink.IngestURL)
		}
		id := ingestKeys.Authenticate(key)
		if id == nil {
			t.Errorf("%s: ingest's keys file does not know the key it sends usage with", w.name)
		} else if !id.Allows("any-tenant-at-all") {
			t.Errorf("%s: its key may not report every tenant (key %s)", w.name, id.ID)
		}
	}
}

// checkBudgets: a PodDisruptionBudget per workload that lets a node drain.
func (r *release) checkBudgets(t *testing.T, ws []workload) {
	covered := map[string]bool{}
	for name, pdb := range r.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || sel.Empty() {
			t.Errorf("PodDisruptionBudget %s: selector %v: %v", name, pdb.Spec.Selector, err)
			continue
		}
		var hit []workload
		for _, w := range ws {
			if sel.Matches(labels.Set(w.pod.Labels)) {
				hit = append(hit, w)
			}
		}
		if len(hit) != 1 {
			t.Errorf("PodDisruptionBudget %s covers %d workloads, want one", name, len(hit))
			continue
		}
		w := hit[0]
		covered[w.name] = true
		if (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
			t.Errorf("PodDisruptionBudget %s: give minAvailable or maxUnavailable, one of them", name)
		}
		replicas := int32(1)
		if w.replicas != nil {
			replicas = *w.replicas
		} else if h := r.hpas[w.name]; h != nil && h.Spec.MinReplicas != nil {
			replicas = *h.Spec.MinReplicas
		}
		if m := pdb.Spec.MinAvailable; m != nil && m.Type == intstr.Int && m.IntVal >= replicas {
			t.Errorf("PodDisruptionBudget %s: minAvailable %d of %d replicas: no node holding one could ever be drained", name, m.IntVal, replicas)
		}
		if m := pdb.Spec.MaxUnavailable; m != nil && m.Type == intstr.Int && m.IntVal < 1 {
			t.Errorf("PodDisruptionBudget %s: maxUnavailable %d blocks every drain", name, m.IntVal)
		}
	}
	for _, w := range ws {
		if !covered[w.name] {
			t.Errorf("%s has no PodDisruptionBudget", w.name)
		}
	}
}

// checkAutoscalers: HPAs scale a Deployment of the release on CPU, the
// Deployment leaves replicas to them, and the gateway's admission knows
// how many processes share its limits.
func (r *release) checkAutoscalers(t *testing.T, ws map[string]workload) {
	for name, h := range r.hpas {
		ref := h.Spec.ScaleTargetRef
		d := r.deployments[ref.Name]
		if ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || d == nil {
			t.Errorf("HorizontalPodAutoscaler %s scales %s %s, not a Deployment of the release", name, ref.Kind, ref.Name)
			continue
		}
		comp := d.Spec.Template.Labels["app.kubernetes.io/component"]
		if comp != "gateway" && comp != "ingest" {
			t.Errorf("HorizontalPodAutoscaler %s scales the %s: only the gateway and ingest are stateless", name, comp)
		}
		if d.Spec.Replicas != nil {
			t.Errorf("%s sets replicas beside its HorizontalPodAutoscaler: every upgrade would reset them", d.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 1 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
			t.Errorf("HorizontalPodAutoscaler %s: replicas %v..%d", name, h.Spec.MinReplicas, h.Spec.MaxReplicas)
		}
		if len(h.Spec.Metrics) == 0 || h.Spec.Metrics[0].Resource == nil || h.Spec.Metrics[0].Resource.Name != corev1.ResourceCPU {
			t.Errorf("HorizontalPodAutoscaler %s does not scale on CPU", name)
		}
	}
	if w, ok := ws["gateway"]; ok {
		p := r.mount(t, w.name, w.pod.Spec, w.pod.Spec.Containers[0], w.podNames(1)[0])
		want := 1
		if w.replicas != nil {
			want = int(*w.replicas)
		} else if h := r.hpas[w.name]; h != nil {
			want = int(*h.Spec.MinReplicas)
		}
		if got := p.cfg.Services.Gateway.Admission.Gateways; got != want {
			t.Errorf("%s: services.gateway.admission.gateways is %d, but %d gateways share the limits", w.name, got, want)
		}
	}
}

// checkMigrations: exactly one way migrates — the hook Job (with copies of
// what it reads, made before it) or the services themselves.
func (r *release) checkMigrations(t *testing.T, ws map[string]workload) {
	var anyCfg *sluiceconfig.Config
	for _, comp := range []string{"aggregator", "enforcer", "reconciler", "ingest", "gateway", "authz", "console", "alerter"} {
		if w, ok := ws[comp]; ok {
			p := r.mount(t, w.name, w.pod.Spec, w.pod.Spec.Containers[0], w.podNames(1)[0])
			anyCfg = &p.cfg
			break
		}
	}
	if len(r.jobs) == 0 {
		return
	}
	if len(r.jobs) != 1 {
		t.Fatalf("%d Jobs, want the migration's", len(r.jobs))
	}
	for name, j := range r.jobs {
		h := r.hooks["Job/"+name]
		if h == nil || !slices.Contains(h.Events, helmrelease.HookPreInstall) || !slices.Contains(h.Events, helmrelease.HookPreUpgrade) {
			t.Errorf("Job %s is not a pre-install and pre-upgrade hook", name)
			continue
		}
		spec := j.Spec.Template.Spec
		// What the hook mounts must be hooks too, made before it: the
		// release's own ConfigMap and Secret do not exist yet.
		for _, v := range spec.Volumes {
			var refs []string
			if v.ConfigMap != nil {
				refs = append(refs, "ConfigMap/"+v.ConfigMap.Name)
			}
			if v.Projected != nil {
				for _, s := range v.Projected.Sources {
					if s.Secret != nil && r.secrets[s.Secret.Name] != nil {
						refs = append(refs, "Secret/"+s.Secret.Name)
					}
				}
			}
			for _, ref := range refs {
				dep := r.hooks[ref]
				if dep == nil || dep.Weight >= h.Weight || !slices.Contains(dep.Events, helmrelease.HookPreInstall) {
					t.Errorf("Job %s mounts %s, which is not a hook made before it", name, ref)
				}
			}
		}
		c := spec.Containers[0]
		p := r.mount(t, "Job "+name, spec, c, name+"-x7k2p")
		if len(c.Args) == 0 || c.Args[0] != "migrate" || len(p.names) != 0 {
			t.Errorf("Job %s runs %v, want sluice migrate", name, c.Args)
		}
		if spec.RestartPolicy != corev1.RestartPolicyNever && spec.RestartPolicy != corev1.RestartPolicyOnFailure {
			t.Errorf("Job %s: restartPolicy %s", name, spec.RestartPolicy)
		}
		if anyCfg != nil {
			if anyCfg.Migrate {
				t.Errorf("the services migrate as they start beside the migration Job")
			}
			if fmt.Sprint(p.cfg.ClickHouse.Servers(), p.cfg.ClickHouse.Database, p.cfg.ClickHouse.Cluster) != fmt.Sprint(anyCfg.ClickHouse.Servers(), anyCfg.ClickHouse.Database, anyCfg.ClickHouse.Cluster) {
				t.Errorf("Job %s migrates ClickHouse %v/%s, the services use %v/%s", name, p.cfg.ClickHouse.Servers(), p.cfg.ClickHouse.Database, anyCfg.ClickHouse.Servers(), anyCfg.ClickHouse.Database)
			}
		}
		if p.cfg.Policy.File != "" {
			if _, err := policy.Load(p.cfg.Policy.File); err != nil {
				t.Errorf("Job %s: the policy it copies prices from: %v", name, err)
			}
		}
	}
}

// TestChartRefusesWhatCannotRun: values that would give a pod a
// configuration the binary refuses, or a release that cannot work, fail at
// render time, naming the value.
func TestChartRefusesWhatCannotRun(t *testing.T) {
	base := func() map[string]any { return readValues(t, "ci/minimal-values.yaml") }
	set := func(v map[string]any, path string, val any) map[string]any {
		parts := strings.Split(path, ".")
		m := v
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = val
		return v
	}
	cases := []struct {
		name string
		vals map[string]any
		want string
	}{
		{"no values", map[string]any{}, "kafka.brokers:|clickhouse.addrs:|redis.addrs:|policy.content:|signalAuth.keys:|ingest.gatewayKeys:"},
		{"no kafka", set(base(), "kafka.brokers", []any{}), "kafka.brokers:"},
		{"no clickhouse", set(base(), "clickhouse.addrs", []any{}), "clickhouse.addrs:"},
		{"no redis", set(base(), "redis.addrs", []any{}), "redis.addrs:"},
		{"two redis without cluster", set(base(), "redis.addrs", []any{"a:6379", "b:6379"}), "redis.cluster"},
		{"no policy", set(base(), "policy.content", ""), "policy.content:"},
		{"no signing keys", set(base(), "signalAuth.keys", []any{}), "signalAuth.keys:"},
		{"no gateway keys for ingest", set(base(), "ingest.gatewayKeys", []any{}), "ingest.gatewayKeys:"},
		{"more aggregators than partitions", set(base(), "aggregator.replicas", 7), "aggregator.replicas:"},
		{"a chart-owned setting in config", set(base(), "config", map[string]any{"services": map[string]any{"ingest": map[string]any{"listen": "0.0.0.0:1"}}}), "config.services.ingest.listen:"},
		{"the process's shutdown in config", set(base(), "config", map[string]any{"shutdown_timeout": "1s"}), "config.shutdown_timeout:"},
		{"gateway without its usage key", set(base(), "gateway.enabled", true), "usageKey.key:"},
		{"gateway without an ingest", set(set(set(base(), "gateway.enabled", true), "usageKey.key", "k"), "ingest.enabled", false), "gateway.usage.ingestURL:"},
		{"console without an admin API", set(set(base(), "console.enabled", true), "enforcer.admin.enabled", false), "console.adminURL:"},
		{"unknown migrations mode", set(base(), "migrations.mode", "init"), "migrations.mode:|/migrations/mode"},
		{"unknown anti-affinity", set(base(), "podDefaults.antiAffinity", "sometimes"), "antiAffinity:|/podDefaults/antiAffinity"},
		{"HPA without a CPU request", set(set(base(), "ingest.autoscaling.enabled", true), "ingest.resources.requests.cpu", nil), "ingest.resources.requests.cpu:"},
		{"a misspelt value", set(base(), "ingest.replica", 3), "replica"},
		{"a misspelt service value", set(base(), "aggregator.antiAfinity", "none"), "antiAfinity"},
		{"a short signing key", set(base(), "signalAuth.keys", []any{map[string]any{"id": "k", "secret": "short"}}), "/signalAuth/keys/0/secret"},
		{"existing secret without its key", set(base(), "clickhouse.existingSecret", map[string]any{"name": "ch", "key": ""}), "clickhouse.existingSecret.key:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, tc.vals)
			t.Logf("refused: %v", err)
			if err == nil || !slices.ContainsFunc(strings.Split(tc.want, "|"), func(w string) bool { return strings.Contains(err.Error(), w) }) {
				t.Errorf("render = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// TestREADMEDocumentsEveryValue: each value of values.yaml is named in the
// chart's README, and the README lists exactly the values files this test
// renders (its "Tested combinations").
func TestREADMEDocumentsEveryValue(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(readme)
	vals := readValues(t, "values.yaml")
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		m, ok := v.(map[string]any)
		if ok && len(m) > 0 && prefix != "config" && !strings.HasSuffix(prefix, "existingSecret") && !strings.HasSuffix(prefix, "ExistingSecret") &&
			!strings.HasSuffix(prefix, "resources") && !strings.HasSuffix(prefix, "SecurityContext") && !strings.HasSuffix(prefix, "securityContext") {
			for k, sub := range m {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, sub)
			}
			return
		}
		if !strings.Contains(doc, "`"+prefix+"`") {
			t.Errorf("README.md does not document `%s`", prefix)
		}
	}
	walk("", vals)
	files, _ := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	var tested []string
	for _, sc := range scenarios {
		tested = append(tested, sc.file)
	}
	for _, f := range files {
		rel, _ := filepath.Rel(chartDir, f)
		if !slices.Contains(tested, rel) {
			t.Errorf("%s is not rendered by this test; add it to scenarios", rel)
		}
	}
	for _, f := range tested {
		if !strings.Contains(doc, "`"+f+"`") {
			t.Errorf("README.md does not document the combination %s", f)
		}
	}
}

// TestRequestsFollowTheMeasuredCost recomputes the CPU requests values.yaml
// derives from bench/results.json — CPU per 1,000 events at the reference
// machine's sustained maximum, run at two thirds of the request — so a new
// measurement that moves them fails here until values.yaml follows.
func TestRequestsFollowTheMeasuredCost(t *testing.T) {
	raw, err := os.ReadFile("../../bench/results.json")
	if err != nil {
		t.Fatal(err)
	}
	var all map[string]any
	if err := yaml.Unmarshal(raw, &all); err != nil {
		t.Fatal(err)
	}
	bench := map[string]float64{}
	for k, v := range all {
		if f, ok := v.(float64); ok {
			bench[k] = f
		}
	}
	vals := readValues(t, "values.yaml")
	rate := bench["e2e_max_sustained_events_per_sec"] / 1000 // thousands of events per second
	if rate == 0 {
		t.Fatal("bench/results.json has no e2e_max_sustained_events_per_sec")
	}
	for _, c := range []struct {
		component, key string
		floor          string
	}{
		{"ingest", "e2e_max_sustained_cpu_ms_per_1k_events_ingest", "50m"},
		{"aggregator", "e2e_max_sustained_cpu_ms_per_1k_events_aggregator", "50m"},
		{"enforcer", "e2e_max_sustained_cpu_ms_per_1k_events_enforcer", "100m"},
		{"alerter", "e2e_max_sustained_cpu_ms_per_1k_events_alerter", "50m"},
	} {
		ms, ok := bench[c.key]
		if !ok {
			t.Errorf("bench/results.json has no %s", c.key)
			continue
		}
		v := vals[c.component].(map[string]any)
		replicas := v["replicas"].(float64)
		if c.component == "enforcer" {
			replicas = 1 // every replica reads every signal
		}
		cores := ms * rate / 1000 / (2.0 / 3.0) / replicas
		floor := resource.MustParse(c.floor)
		req := v["resources"].(map[string]any)["requests"].(map[string]any)["cpu"]
		q := resource.MustParse(fmt.Sprint(req))
		got := float64(q.MilliValue()) / 1000
		// Rounded up to 50m, with room for a new measurement to move by a
		// fifth before values.yaml must follow; below the floor, the floor.
		lo, hi := cores*0.8, cores*1.25+0.05
		if hi < floor.AsApproximateFloat64() {
			lo, hi = floor.AsApproximateFloat64(), floor.AsApproximateFloat64()
		}
		if got < lo || got > hi {
			t.Errorf("%s.resources.requests.cpu is %.3g cores; %s = %.3g ms per 1,000 events × %.0fk events/s ÷ 2/3 ÷ %v replicas = %.3f cores: update values.yaml (its comment and the request) to the measurement", c.component, got, c.key, ms, rate, replicas, cores)
		}
	}
	// The gateway's request is quoted from its measured cost per request.
	ms := bench["gateway_cpu_ms_per_1k_requests"]
	text, _ := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	m := regexp.MustCompile(`([0-9.]+) ms CPU per 1,000 requests`).FindSubmatch(text)
	if m == nil {
		t.Fatal("values.yaml's gateway sizing quotes no ms CPU per 1,000 requests")
	}
	quoted, _ := strconv.ParseFloat(string(m[1]), 64)
	if quoted < ms*0.8 || quoted > ms*1.25 {
		t.Errorf("values.yaml sizes the gateway from %.1f ms CPU per 1,000 requests; bench/results.json's gateway_cpu_ms_per_1k_requests is now %.1f: update it and gateway.resources", quoted, ms)
	}
}
