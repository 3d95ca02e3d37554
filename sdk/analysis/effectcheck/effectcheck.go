package effectcheck

import (
	"go/ast"
	"go/build"
	"go/constant"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

// SDKPath is the import path of the SDK whose handler interfaces the
// analyzer checks.
const SDKPath = "github.com/usherhq/usher/sdk"

// Analyzer reports effects outside a handler's effect phase,
// sdk.KeyForTest outside tests and claim effects whose key never reaches
// the provider call.
var Analyzer = &analysis.Analyzer{
	Name:      "effectcheck",
	Doc:       "report effects outside a handler's effect phase, sdk.KeyForTest outside tests, and claim effects whose key never reaches the provider call",
	URL:       "https://pkg.go.dev/github.com/usherhq/usher/sdk/analysis/effectcheck",
	Run:       run,
	FactTypes: []analysis.Fact{new(Effects), new(KeySink)},
}

// Directives.
const (
	dirEffect = "usher:effect"
	dirKeyed  = "usher:idempotent-by-key"
	dirNone   = "usher:no-effect"
)

// maxPath bounds the call chain a witness keeps.
const maxPath = 6

// Witness is one effect a function reaches: what it is and the calls that
// lead to it, outermost first, ending at the effect itself.
type Witness struct {
	Kind string   // "network call", "file write", "process start", "marked effect"
	Path []string // e.g. ["(*mail.Client).Send", "sdk.NewProviderRequest"]
}

func (w Witness) zero() bool { return w.Kind == "" }

func (w Witness) via(name string) Witness {
	if name == "" {
		return w
	}
	p := append([]string{name}, w.Path...)
	if len(p) > maxPath {
		p = append(p[:maxPath-1:maxPath-1], "...")
	}
	return Witness{Kind: w.Kind, Path: p}
}

func (w Witness) String() string { return w.Kind + " " + strings.Join(w.Path, " -> ") }

// Effects is the fact exported for a function that reaches an effect.
// Unkeyed is an effect a second run repeats; Keyed one declared
// //usher:idempotent-by-key.
type Effects struct {
	Unkeyed Witness
	Keyed   Witness
	// Impure is what only a workflow's decision may not do besides an
	// effect: read the machine's clock (time comes from the history) or
	// open or use a database of its own.
	Impure Witness
}

// AFact implements analysis.Fact.
func (*Effects) AFact() {}

func (e *Effects) String() string {
	var parts []string
	if !e.Unkeyed.zero() {
		parts = append(parts, "effect: "+e.Unkeyed.String())
	}
	if !e.Keyed.zero() {
		parts = append(parts, "keyed: "+e.Keyed.String())
	}
	if !e.Impure.zero() {
		parts = append(parts, "impure: "+e.Impure.String())
	}
	return strings.Join(parts, "; ")
}

func (e Effects) empty() bool { return e.Unkeyed.zero() && e.Keyed.zero() && e.Impure.zero() }

// merge adds what a call to a callee with effects c brings, reached through
// the call named name; it reports whether e changed. First witness wins, so
// the fixed point is reached.
func (e *Effects) merge(c Effects, name string) bool {
	changed := false
	if e.Unkeyed.zero() && !c.Unkeyed.zero() {
		e.Unkeyed, changed = c.Unkeyed.via(name), true
	}
	if e.Keyed.zero() && !c.Keyed.zero() {
		e.Keyed, changed = c.Keyed.via(name), true
	}
	if e.Impure.zero() && !c.Impure.zero() {
		e.Impure, changed = c.Impure.via(name), true
	}
	return changed
}

type funcInfo struct {
	decl    *ast.FuncDecl
	fixed   bool // a directive decided its effects
	effects Effects
}

func run(pass *analysis.Pass) (any, error) {
	if inGOROOT(pass) {
		return nil, nil // the standard library's effects are the list, its bodies are not walked
	}
	pkgEffect := false
	for _, f := range pass.Files {
		for _, d := range directives(pass, f.Doc) {
			if d == dirEffect {
				pkgEffect = true
			}
		}
	}

	funcs := map[*types.Func]*funcInfo{}
	var order []*types.Func
	for _, f := range pass.Files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			fn, ok := pass.TypesInfo.Defs[fd.Name].(*types.Func)
			if !ok {
				continue
			}
			fi := &funcInfo{decl: fd}
			dirs := directives(pass, fd.Doc)
			switch {
			case slices.Contains(dirs, dirNone):
				fi.fixed = true
			case slices.Contains(dirs, dirKeyed):
				fi.fixed = true
				fi.effects.Keyed = Witness{Kind: "effect idempotent by key", Path: []string{"//" + dirKeyed}}
			case slices.Contains(dirs, dirEffect) || pkgEffect:
				fi.fixed = true
				fi.effects.Unkeyed = Witness{Kind: "marked effect", Path: []string{"//" + dirEffect}}
			}
			funcs[fn] = fi
			order = append(order, fn)
		}
	}

	// The package's functions to a fixed point: a witness, once found, stays.
	for changed := true; changed; {
		changed = false
		for _, fn := range order {
			fi := funcs[fn]
			if fi.fixed || fi.decl.Body == nil {
				continue
			}
			forEachCall(pass, fi.decl.Body, func(call *ast.CallExpr, callee *types.Func) {
				if e, name, ok := calleeEffects(pass, funcs, call, callee); ok && fi.effects.merge(e, name) {
					changed = true
				}
			})
		}
	}
	for _, fn := range order {
		if e := funcs[fn].effects; !e.empty() {
			pass.ExportObjectFact(fn, &e)
		}
	}

	if sdk := sdkPackage(pass.Pkg); sdk != nil && pass.Pkg.Path() != SDKPath {
		flow := newKeyFlow(pass, sdk)
		if flow != nil {
			flow.exportSinks(order)
		}
		checkHandlers(pass, sdk, funcs, flow)
		checkDecisions(pass, funcs)
		checkKeyForTest(pass, sdk)
	}
	return nil, nil
}

// calleeEffects returns what a call to callee brings and the name to show
// for it.
func calleeEffects(pass *analysis.Pass, funcs map[*types.Func]*funcInfo, call *ast.CallExpr, callee *types.Func) (Effects, string, bool) {
	if kind := primitive(pass, call, callee); kind != "" {
		return Effects{Unkeyed: Witness{Kind: kind, Path: []string{funcName(callee)}}}, "", true
	}
	if kind := impure(callee); kind != "" {
		return Effects{Impure: Witness{Kind: kind, Path: []string{funcName(callee)}}}, "", true
	}
	if fi, ok := funcs[callee]; ok {
		return fi.effects, funcName(callee), !fi.effects.empty()
	}
	if callee.Pkg() != nil && callee.Pkg().Path() == SDKPath {
		// The SDK's handles reach the host, which decides what a phase may
		// do; only its provider call path is an effect, listed above.
		return Effects{}, "", false
	}
	var e Effects
	if pass.ImportObjectFact(callee, &e) {
		return e, funcName(callee), true
	}
	return Effects{}, "", false
}

// forEachCall calls f for every static call in body, function literals
// included.
func forEachCall(pass *analysis.Pass, body ast.Node, f func(*ast.CallExpr, *types.Func)) {
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if fn, ok := typeutil.Callee(pass.TypesInfo, call).(*types.Func); ok {
			f(call, fn.Origin())
		}
		return true
	})
}

// Names of effects in the standard library and the SDK.
var (
	httpClientFuncs = set("Get", "Head", "Post", "PostForm", "ListenAndServe", "ListenAndServeTLS", "Serve", "ServeTLS")
	httpMethods     = map[string]map[string]bool{
		"Client":    set("Do", "Get", "Head", "Post", "PostForm"),
		"Transport": set("RoundTrip"),
		"Server":    set("ListenAndServe", "ListenAndServeTLS", "Serve", "ServeTLS"),
	}
	fileFuncs = set("Create", "CreateTemp", "WriteFile", "Mkdir", "MkdirAll", "MkdirTemp", "Remove", "RemoveAll",
		"Rename", "Symlink", "Link", "Chmod", "Chown", "Lchown", "Chtimes", "Truncate", "CopyFS",
		"TempFile", "TempDir") // the last two are io/ioutil's
	execMethods = set("Run", "Start", "Output", "CombinedOutput")
)

// primitive classifies a call to a known effect, or returns "".
func primitive(pass *analysis.Pass, call *ast.CallExpr, fn *types.Func) string {
	if fn.Pkg() == nil {
		return ""
	}
	name := fn.Name()
	recv := recvName(fn)
	switch fn.Pkg().Path() {
	case "net":
		for _, p := range []string{"Dial", "Listen", "Lookup"} {
			if strings.HasPrefix(name, p) {
				return "network call"
			}
		}
	case "net/http":
		if recv == "" && httpClientFuncs[name] || httpMethods[recv][name] {
			return "network call"
		}
	case "net/smtp":
		if name == "SendMail" || name == "Dial" {
			return "network call"
		}
	case "net/rpc":
		if strings.HasPrefix(name, "Dial") {
			return "network call"
		}
	case SDKPath:
		if name == "NewProviderRequest" {
			return "network call"
		}
	case "os", "io/ioutil":
		if recv != "" && recv != "Root" {
			return ""
		}
		if name == "OpenFile" && !writeFlag(pass, call) {
			return ""
		}
		if fileFuncs[name] || name == "OpenFile" {
			return "file write"
		}
		if name == "StartProcess" {
			return "process start"
		}
	case "os/exec":
		if recv == "Cmd" && execMethods[name] {
			return "process start"
		}
	case "syscall":
		if name == "Exec" || name == "ForkExec" || name == "StartProcess" {
			return "process start"
		}
	}
	return ""
}

// clockFuncs read the machine's clock.
var clockFuncs = set("Now", "Since", "Until")

// impure classifies a call only a decision may not make: a clock read or
// a database of its own (database/sql), or returns "".
func impure(fn *types.Func) string {
	if fn.Pkg() == nil {
		return ""
	}
	switch fn.Pkg().Path() {
	case "time":
		if recvName(fn) == "" && clockFuncs[fn.Name()] {
			return "clock read"
		}
	case "database/sql":
		if recvName(fn) == "" && (fn.Name() == "Open" || fn.Name() == "OpenDB") ||
			set("DB", "Conn", "Tx", "Stmt")[recvName(fn)] {
			return "database call"
		}
	}
	return ""
}

// writeFlag reports whether an OpenFile call may write: its flag argument
// has a write bit or is not a constant.
func writeFlag(pass *analysis.Pass, call *ast.CallExpr) bool {
	if len(call.Args) < 2 {
		return true
	}
	tv, ok := pass.TypesInfo.Types[call.Args[1]]
	if !ok || tv.Value == nil {
		return true
	}
	flag, ok := constant.Int64Val(tv.Value)
	if !ok {
		return true
	}
	return flag&int64(os.O_WRONLY|os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_TRUNC) != 0
}

// recvName is the name of fn's receiver's named type, or "".
func recvName(fn *types.Func) string {
	sig, _ := fn.Type().(*types.Signature)
	if sig == nil || sig.Recv() == nil {
		return ""
	}
	if n, ok := deref(sig.Recv().Type()).(*types.Named); ok {
		return n.Obj().Name()
	}
	return ""
}

// funcName is fn as a reader knows it: pkg.F or (*pkg.T).M.
func funcName(fn *types.Func) string {
	pkg := ""
	if fn.Pkg() != nil {
		pkg = fn.Pkg().Name() + "."
	}
	sig, _ := fn.Type().(*types.Signature)
	if sig == nil || sig.Recv() == nil {
		return pkg + fn.Name()
	}
	t := sig.Recv().Type()
	star := ""
	if p, ok := t.(*types.Pointer); ok {
		star, t = "*", p.Elem()
	}
	if n, ok := t.(*types.Named); ok {
		return "(" + star + pkg + n.Obj().Name() + ")." + fn.Name()
	}
	return fn.Name() // an interface method
}

// directives returns the usher directives of a doc comment, reporting the
// unknown ones.
func directives(pass *analysis.Pass, doc *ast.CommentGroup) []string {
	if doc == nil {
		return nil
	}
	var out []string
	for _, c := range doc.List {
		text, ok := strings.CutPrefix(c.Text, "//usher:")
		if !ok {
			continue
		}
		d, _, _ := strings.Cut(text, " ")
		d = "usher:" + d
		switch d {
		case dirEffect, dirKeyed, dirNone:
			out = append(out, d)
		default:
			pass.Reportf(c.Pos(), "unknown directive //%s (want //%s, //%s or //%s)", d, dirEffect, dirKeyed, dirNone)
		}
	}
	return out
}

func set(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

func deref(t types.Type) types.Type {
	if p, ok := t.(*types.Pointer); ok {
		return p.Elem()
	}
	return t
}

// inGOROOT reports whether pass analyzes a standard library package.
func inGOROOT(pass *analysis.Pass) bool {
	if len(pass.Files) == 0 || build.Default.GOROOT == "" {
		return false
	}
	name := pass.Fset.File(pass.Files[0].Pos()).Name()
	return strings.HasPrefix(name, filepath.Join(build.Default.GOROOT, "src")+string(filepath.Separator))
}

// sdkPackage returns the SDK if pkg imports it (or is it).
func sdkPackage(pkg *types.Package) *types.Package {
	if pkg.Path() == SDKPath {
		return pkg
	}
	for _, p := range pkg.Imports() {
		if p.Path() == SDKPath {
			return p
		}
	}
	return nil
}

// checkKeyForTest reports sdk.KeyForTest in files not named *_test.go.
func checkKeyForTest(pass *analysis.Pass, sdk *types.Package) {
	kft := sdk.Scope().Lookup("KeyForTest")
	if kft == nil {
		return
	}
	for _, f := range pass.Files {
		if strings.HasSuffix(pass.Fset.File(f.Pos()).Name(), "_test.go") {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && pass.TypesInfo.Uses[id] == kft {
				pass.Reportf(id.Pos(), "sdk.KeyForTest outside a _test.go file: a handler must send with the key its Effect receives")
			}
			return true
		})
	}
}
