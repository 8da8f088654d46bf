package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// maxFuncLines is the longest a non-test function may be: past it a
// reader loses the thread, and the function has stages that want names.
const maxFuncLines = 120

// TestLayoutKeepsItsRules walks the module's Go files and fails on what
// the request-path re-cut removed and a later change could bring back:
// a non-test function over maxFuncLines lines, a package under
// services/<a> importing one under services/<b> (what two services share
// belongs in a package made for sharing), or a second package named
// gateway.
func TestLayoutKeepsItsRules(t *testing.T) {
	const module = "github.com/sluicehq/sluice/"
	gatewayPackages := map[string]bool{}
	files := 0
	walkModule(t, func(path, rel string) error {
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		if f.Name.Name == "gateway" {
			gatewayPackages[filepath.Dir(rel)] = true
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
				t.Errorf("%s:%d: func %s is %d lines; split it into named stages of at most %d", rel, fset.Position(fn.Pos()).Line, fn.Name.Name, n, maxFuncLines)
			}
		}
		own := serviceOf(rel)
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.HasPrefix(p, module) {
				continue
			}
			if other := serviceOf(strings.TrimPrefix(p, module)); own != "" && other != "" && other != own {
				t.Errorf("%s imports %s: a service imports no other service; move what both need into a package made for sharing", rel, p)
			}
		}
		return nil
	})
	if files < 100 {
		t.Fatalf("read %d Go files; the walk missed the module", files)
	}
	if len(gatewayPackages) > 1 {
		t.Errorf("packages named gateway in %v; one name, one thing", gatewayPackages)
	}
}

// serviceOf is the service a module-relative path belongs to
// (services/<name>/...), or "".
func serviceOf(rel string) string {
	rest, ok := strings.CutPrefix(rel, "services/")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, "/")
	if strings.HasSuffix(name, ".go") {
		return ""
	}
	return name
}

// walkModule calls fn with the path and the module-relative slash path of
// every file of the module, leaving out hidden folders (.services, .git),
// testdata, vendor and node_modules; an error of fn ends the walk and the
// test.
func walkModule(t *testing.T, fn func(path, rel string) error) {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		return fn(path, filepath.ToSlash(rel))
	})
	if err != nil {
		t.Fatal(err)
	}
}
