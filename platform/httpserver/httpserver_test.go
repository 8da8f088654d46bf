package httpserver_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/itest"
)

func TestNewSetsEveryTimeout(t *testing.T) {
	srv := httpserver.New(http.NotFoundHandler(), httpserver.Timeouts{Read: time.Second}, nil)
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout != time.Second || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 || srv.MaxHeaderBytes != httpserver.MaxHeaderBytes {
		t.Fatalf("server timeouts: header %v, read %v, write %v, idle %v, max header %d; want all set",
			srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout, srv.MaxHeaderBytes)
	}
	if err := httpserver.Defaults().Validate("ops.http"); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	err := httpserver.Timeouts{ReadHeader: time.Minute, Read: time.Second, Write: 0, Idle: 2 * time.Hour}.Validate("ops.http")
	for _, want := range []string{"ops.http.write_timeout: 0s is outside 10ms..1h", "ops.http.idle_timeout", "ops.http.read_header_timeout: 1m0s is longer than ops.http.read_timeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want it to say %q", err, want)
		}
	}
}

// short are timeouts a test can wait out.
var short = httpserver.Timeouts{ReadHeader: 200 * time.Millisecond, Read: 300 * time.Millisecond, Write: 300 * time.Millisecond, Idle: 300 * time.Millisecond}

// serve runs New(h, short) on a loopback port until the test ends.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httpserver.New(h, short, nil)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// A slowloris client cannot hold a connection: not by trickling headers,
// not by announcing a body it never sends (to a handler that reads it, or
// to one that answers without reading it), not by idling on keep-alive.
func TestSlowClientsAreCutOff(t *testing.T) {
	reads := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	ignores := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))

	t.Run("headers never finished", func(t *testing.T) {
		itest.ExpectCutOff(t, reads, "POST / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	})
	for name, addr := range map[string]string{"handler reads body": reads, "handler ignores body": ignores} {
		t.Run("body never finished, "+name, func(t *testing.T) {
			itest.ExpectCutOff(t, addr, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{\"a\":")
		})
	}
	t.Run("idle keep-alive", func(t *testing.T) {
		itest.ExpectCutOff(t, ignores, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	})
}

// TestEveryServerIsBuiltHere fails when any non-test Go file of the module
// outside this package builds an http.Server itself (a composite literal
// or new(http.Server)): such a server would have no timeouts unless its
// author remembered every one.
func TestEveryServerIsBuiltHere(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	self := filepath.Join(root, "platform", "httpserver")
	fset := token.NewFileSet()
	var offenders []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || name == "node_modules") || path == self {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		httpName := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"net/http"` {
				httpName = "http"
				if imp.Name != nil {
					httpName = imp.Name.Name
				}
			}
		}
		if httpName == "" {
			return nil
		}
		isServer := func(e ast.Expr) bool {
			sel, ok := e.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Server" {
				return false
			}
			id, ok := sel.X.(*ast.Ident)
			return ok && id.Name == httpName
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				if n.Type != nil && isServer(n.Type) {
					offenders = append(offenders, fset.Position(n.Pos()).String())
				}
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "new" && len(n.Args) == 1 && isServer(n.Args[0]) {
					offenders = append(offenders, fset.Position(n.Pos()).String())
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range offenders {
		t.Errorf("%s builds an http.Server directly; use httpserver.New so it has read, write and idle timeouts", o)
	}
}
