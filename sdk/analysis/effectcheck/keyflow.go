package effectcheck

import (
	"fmt"
	"go/types"
	"slices"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/ssa"
)

// KeySink is the fact exported for a function some of whose parameters
// reach a provider call: the key of sdk.NewProviderRequest, the value of an
// http.Header's Set or Add (or of a header assigned by name), or a
// parameter of another function that reaches one.
type KeySink struct {
	// Params are the indexes of those parameters, a method's receiver
	// counted first (index 0).
	Params []int
	// Sink is the provider call the first of them reaches.
	Sink string
}

// AFact implements analysis.Fact.
func (*KeySink) AFact() {}

func (k *KeySink) String() string {
	return fmt.Sprintf("key reaches %s from parameters %v", k.Sink, k.Params)
}

// keyFlow follows values through one package's SSA: a value derived from
// a key (a copy, key.String(), a string built from it, a field or an
// element it was stored in, a call's result it was an argument of, a
// closure's captured variable) reaches the provider when it is passed to
// a provider call.
//
// Within the package the flow enters the functions it is passed to (their
// parameters, context-insensitively); a function of another package that
// imports the SDK is known by its KeySink fact, and one that does not
// import it (a provider's own client library, which the analyzer does not
// follow) is trusted with whatever it is passed. The standard library is
// not: a key that only reaches a log line, fmt or an error does not reach
// the provider. A value stored in a global is not followed.
type keyFlow struct {
	pass *analysis.Pass
	pkg  *ssa.Package
	key  types.Type // sdk.IdempotencyKey
}

// newKeyFlow builds the package's SSA. It returns nil when the SDK has no
// IdempotencyKey (an SDK of another shape).
func newKeyFlow(pass *analysis.Pass, sdk *types.Package) *keyFlow {
	key, ok := sdk.Scope().Lookup("IdempotencyKey").(*types.TypeName)
	if !ok {
		return nil
	}
	prog := ssa.NewProgram(pass.Fset, ssa.BuilderMode(0))
	for _, p := range pass.Pkg.Imports() {
		prog.CreatePackage(p, nil, nil, true)
	}
	pkg := prog.CreatePackage(pass.Pkg, pass.Files, pass.TypesInfo, false)
	pkg.Build()
	return &keyFlow{pass: pass, pkg: pkg, key: key.Type()}
}

// function returns fn's SSA function, or nil.
func (k *keyFlow) function(fn *types.Func) *ssa.Function {
	return k.pkg.Prog.FuncValue(fn)
}

// exportSinks exports a KeySink fact for each of fns whose parameters of
// a type a key travels as (sdk.IdempotencyKey, a string) reach a provider
// call.
func (k *keyFlow) exportSinks(fns []*types.Func) {
	for _, fn := range fns {
		f := k.function(fn)
		if f == nil || f.Blocks == nil {
			continue
		}
		var sink KeySink
		for i, p := range f.Params {
			if !k.carries(p.Type()) {
				continue
			}
			if s, ok := k.reaches(p); ok {
				if sink.Sink == "" {
					sink.Sink = s
				}
				sink.Params = append(sink.Params, i)
			}
		}
		if sink.Params != nil {
			k.pass.ExportObjectFact(fn, &sink)
		}
	}
}

// paramReaches reports whether fn's parameter v reaches a provider call.
func (k *keyFlow) paramReaches(fn *types.Func, v *types.Var) bool {
	f := k.function(fn)
	if f == nil {
		return true // not built: say nothing rather than something wrong
	}
	for _, p := range f.Params {
		if p.Object() == v {
			_, ok := k.reaches(p)
			return ok
		}
	}
	return true
}

// carries reports whether t is a type a key travels as: the SDK's key, or
// a string (what a provider's own client takes).
func (k *keyFlow) carries(t types.Type) bool {
	if types.Identical(t, k.key) {
		return true
	}
	b, ok := t.Underlying().(*types.Basic)
	return ok && b.Info()&types.IsString != 0
}

// reaches reports whether seed, or a value derived from it, is passed to a
// provider call, and names the call.
func (k *keyFlow) reaches(seed ssa.Value) (string, bool) {
	seen := map[ssa.Value]bool{}
	work := []ssa.Value{seed}
	taint := func(v ssa.Value) {
		if v != nil && !seen[v] {
			work = append(work, v)
		}
	}
	for len(work) > 0 {
		v := work[len(work)-1]
		work = work[:len(work)-1]
		if seen[v] {
			continue
		}
		seen[v] = true
		refs := v.Referrers()
		if refs == nil {
			continue
		}
		for _, instr := range *refs {
			switch x := instr.(type) {
			case ssa.CallInstruction:
				c := x.Common()
				if sink, ok := k.sink(c, v); ok {
					return sink, true
				}
				if callee := k.local(c); callee != nil {
					for i, a := range c.Args {
						if a == v && i < len(callee.Params) {
							taint(callee.Params[i])
						}
					}
				}
				if r := x.Value(); r != nil {
					taint(r) // what a call makes of the key: key.String(), fmt.Sprint(key)
				}
			case *ssa.Store:
				if x.Val == v {
					taint(x.Addr)
					taint(base(x.Addr))
				}
			case *ssa.MapUpdate:
				if x.Value == v {
					if isHeader(x.Map.Type()) {
						return "an http.Header", true
					}
					taint(x.Map)
				}
			case *ssa.MakeClosure:
				fn, _ := x.Fn.(*ssa.Function)
				for i, b := range x.Bindings {
					if b == v && fn != nil && i < len(fn.FreeVars) {
						taint(fn.FreeVars[i])
					}
				}
				taint(x)
			case ssa.Value:
				taint(x) // a copy, a conversion, a field, an element, a string built from it
			}
		}
	}
	return "", false
}

// base is the variable, struct or slice an address points into, or nil.
func base(addr ssa.Value) ssa.Value {
	switch a := addr.(type) {
	case *ssa.FieldAddr:
		return a.X
	case *ssa.IndexAddr:
		return a.X
	}
	return nil
}

// local returns the function of this package a call enters, with a body,
// or nil.
func (k *keyFlow) local(c *ssa.CallCommon) *ssa.Function {
	f := c.StaticCallee()
	if f == nil {
		return nil
	}
	if o := f.Origin(); o != nil {
		f = o
	}
	if f.Pkg != k.pkg || f.Blocks == nil {
		return nil
	}
	return f
}

// sink reports whether call c passes v to a provider call, and names it.
func (k *keyFlow) sink(c *ssa.CallCommon, v ssa.Value) (string, bool) {
	f := c.StaticCallee()
	if f == nil {
		// Through an interface or a function value: trusted when the
		// parameter it is passed as is a key, the only use a key has.
		sig := c.Signature()
		for i, a := range c.Args {
			if a == v && i < sig.Params().Len() && types.Identical(sig.Params().At(i).Type(), k.key) {
				name := "a function value"
				if c.IsInvoke() {
					name = c.Method.Name()
				}
				return name + "'s key parameter", true
			}
		}
		return "", false
	}
	if o := f.Origin(); o != nil {
		f = o
	}
	fn, _ := f.Object().(*types.Func)
	if fn == nil || !slices.Contains(c.Args, v) {
		return "", false
	}
	fn = fn.Origin()
	pkg := fn.Pkg()
	switch {
	case pkg == nil:
		return "", false
	case pkg.Path() == SDKPath:
		if fn.Name() == "NewProviderRequest" && argIs(c, v, k.key) {
			return "sdk.NewProviderRequest", true
		}
		return "", false
	case pkg.Path() == "net/http" && recvName(fn) == "Header" && (fn.Name() == "Set" || fn.Name() == "Add"):
		if len(c.Args) == 3 && c.Args[2] == v {
			return "(http.Header)." + fn.Name(), true
		}
		return "", false
	case pkg == k.pass.Pkg:
		return "", false // entered instead (reaches)
	case inStd(pkg):
		return "", false
	}
	if !importsSDK(pkg) {
		// A provider's own client: passed the key, as a key or a string.
		if k.carries(v.Type()) {
			return funcName(fn) + " (a client the analyzer does not follow)", true
		}
		return "", false
	}
	var sink KeySink
	if !k.pass.ImportObjectFact(fn, &sink) {
		return "", false
	}
	for _, i := range sink.Params {
		if i < len(c.Args) && c.Args[i] == v {
			return strings.TrimSuffix(funcName(fn)+" -> "+sink.Sink, " -> "), true
		}
	}
	return "", false
}

// argIs reports whether v is passed as a parameter of type t.
func argIs(c *ssa.CallCommon, v ssa.Value, t types.Type) bool {
	for _, a := range c.Args {
		if a == v && types.Identical(a.Type(), t) {
			return true
		}
	}
	return false
}

// isHeader reports whether t is net/http's Header.
func isHeader(t types.Type) bool {
	n, ok := t.(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == "net/http" && n.Obj().Name() == "Header"
}

// inStd reports whether pkg is in the standard library: its path's first
// element has no dot.
func inStd(pkg *types.Package) bool {
	first, _, _ := strings.Cut(pkg.Path(), "/")
	return !strings.Contains(first, ".")
}

// importsSDK reports whether pkg imports the SDK, so the analyzer followed
// it and its facts say what reaches a provider.
func importsSDK(pkg *types.Package) bool {
	for _, p := range pkg.Imports() {
		if p.Path() == SDKPath {
			return true
		}
	}
	return false
}
