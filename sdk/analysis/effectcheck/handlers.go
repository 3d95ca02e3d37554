package effectcheck

import (
	"go/ast"
	"go/token"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

// guards lists each SDK guard interface with its methods; the first names
// the method whose parameters give the interface's type arguments.
var guards = []struct {
	iface   string
	methods []string
	jobArg  int // index of the sdk.Job parameter in methods[0]
}{
	{"StateFirst", []string{"Check", "Prepare", "Commit"}, 1},
	{"ClaimEffect", []string{"Effect", "Claim"}, 1},
	{"RecordJobID", []string{"Apply"}, 1},
}

// checkHandlers checks the methods of every handler type declared in the
// package, and every middleware: the Wrap method of a type implementing
// sdk.Middleware and a function literal converted to sdk.MiddlewareFunc.
func checkHandlers(pass *analysis.Pass, sdk *types.Package, funcs map[*types.Func]*funcInfo, flow *keyFlow) {
	checkMiddlewareFuncs(pass, sdk, funcs)
	known := map[*types.TypeName]map[string]bool{} // handler type -> its guard's methods
	for _, f := range pass.Files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || fd.Body == nil {
				continue
			}
			fn, ok := pass.TypesInfo.Defs[fd.Name].(*types.Func)
			if !ok {
				continue
			}
			recv := fn.Type().(*types.Signature).Recv().Type()
			named, ok := deref(recv).(*types.Named)
			if !ok {
				continue
			}
			obj := named.Obj()
			if fn.Name() == "Wrap" && isMiddleware(sdk, recv) {
				checkPhase(pass, fd.Body, obj.Name()+".Wrap", middleware, funcs)
				continue
			}
			methods, seen := known[obj]
			if !seen {
				methods = guardOf(sdk, recv)
				known[obj] = methods
			}
			if !methods[fn.Name()] {
				continue
			}
			phase := obj.Name() + "." + fn.Name()
			switch fn.Name() {
			case "Effect":
				checkKeyUsed(pass, fd, fn, phase, flow)
			case "Prepare":
				checkPhase(pass, fd.Body, phase, keyedOnly, funcs)
			default:
				checkPhase(pass, fd.Body, phase, noEffect, funcs)
			}
		}
	}
}

// guardOf returns the methods of the SDK guard that recv's type (or a
// pointer to it) implements, or nil. The guard's type arguments are read
// from the methods' own parameters, so generic handler types are checked
// with their type parameters as arguments.
func guardOf(sdk *types.Package, recv types.Type) map[string]bool {
	base := deref(recv)
	for _, g := range guards {
		gen, ok := sdk.Scope().Lookup(g.iface).(*types.TypeName)
		if !ok {
			continue
		}
		sig := methodSig(base, g.methods[0])
		if sig == nil || sig.Params().Len() <= g.jobArg {
			continue
		}
		job, ok := sig.Params().At(g.jobArg).Type().(*types.Named)
		if !ok || job.Obj().Pkg() != sdk || job.Obj().Name() != "Job" || job.TypeArgs().Len() != 1 {
			continue
		}
		args := []types.Type{job.TypeArgs().At(0)}
		if g.iface == "StateFirst" {
			if sig.Results().Len() == 0 {
				continue
			}
			args = append(args, sig.Results().At(0).Type())
		}
		inst, err := types.Instantiate(nil, gen.Type(), args, false)
		if err != nil {
			continue
		}
		iface, ok := inst.Underlying().(*types.Interface)
		if !ok {
			continue
		}
		if types.Implements(base, iface) || types.Implements(types.NewPointer(base), iface) {
			return set(g.methods...)
		}
	}
	return nil
}

// methodSig returns the signature of t's (or *t's) method name.
func methodSig(t types.Type, name string) *types.Signature {
	obj, _, _ := types.LookupFieldOrMethod(types.NewPointer(t), false, nil, name)
	if fn, ok := obj.(*types.Func); ok {
		return fn.Type().(*types.Signature)
	}
	return nil
}

// isMiddleware reports whether recv's type (or a pointer to it) implements
// sdk.Middleware.
func isMiddleware(sdk *types.Package, recv types.Type) bool {
	obj, ok := sdk.Scope().Lookup("Middleware").(*types.TypeName)
	if !ok {
		return false
	}
	iface, ok := obj.Type().Underlying().(*types.Interface)
	if !ok {
		return false
	}
	base := deref(recv)
	return types.Implements(base, iface) || types.Implements(types.NewPointer(base), iface)
}

// checkMiddlewareFuncs checks every function literal converted to
// sdk.MiddlewareFunc. A named function converted is not followed.
func checkMiddlewareFuncs(pass *analysis.Pass, sdk *types.Package, funcs map[*types.Func]*funcInfo) {
	mf, ok := sdk.Scope().Lookup("MiddlewareFunc").(*types.TypeName)
	if !ok {
		return
	}
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			tv, ok := pass.TypesInfo.Types[call.Fun]
			if !ok || !tv.IsType() || !types.Identical(tv.Type, mf.Type()) {
				return true
			}
			if lit, ok := call.Args[0].(*ast.FuncLit); ok {
				checkPhase(pass, lit.Body, "sdk.MiddlewareFunc", middleware, funcs)
			}
			return true
		})
	}
}

// rule is what a checked body may reach.
type rule int

const (
	noEffect   rule = iota // Check, Commit, Apply, Claim
	keyedOnly              // Prepare: effects declared idempotent by key
	middleware             // a middleware: no effect, it runs in every phase
)

// checkPhase reports each call in body whose callee reaches an effect the
// rule does not allow.
func checkPhase(pass *analysis.Pass, body *ast.BlockStmt, phase string, r rule, funcs map[*types.Func]*funcInfo) {
	forEachCall(pass, body, func(call *ast.CallExpr, callee *types.Func) {
		e, name, ok := calleeEffects(pass, funcs, call, callee)
		if !ok {
			return
		}
		w := e.Unkeyed.via(name)
		var hint string
		switch {
		case r == keyedOnly:
			hint = "only a call declared //usher:idempotent-by-key may have an effect in Prepare"
		case r == middleware:
			hint = "a middleware runs in every phase; effects belong in a ClaimEffect's Effect"
			if w.zero() {
				w = e.Keyed.via(name)
			}
		case e.Unkeyed.zero():
			w = e.Keyed.via(name)
			hint = "an effect idempotent by key belongs in Prepare or a ClaimEffect's Effect"
		default:
			hint = "effects belong in a ClaimEffect's Effect"
		}
		if w.zero() {
			return
		}
		pass.Reportf(call.Pos(), "%s: %s outside the effect phase: %s (%s)", phase, w.Kind, strings.Join(w.Path, " -> "), hint)
	})
}

// checkKeyUsed reports a claim effect whose IdempotencyKey parameter is
// unnamed, blank, never used, or used but never passed to a provider call
// (followed through the package's SSA, see keyFlow): a provider call
// without it cannot be deduplicated.
func checkKeyUsed(pass *analysis.Pass, fd *ast.FuncDecl, fn *types.Func, phase string, flow *keyFlow) {
	params := fn.Type().(*types.Signature).Params()
	const keyIdx = 3
	if params.Len() <= keyIdx {
		return
	}
	key := params.At(keyIdx)
	pos := paramPos(fd, keyIdx)
	if key.Name() == "" || key.Name() == "_" {
		pass.Reportf(pos, "%s ignores its idempotency key: name it and send it with the effect (sdk.NewProviderRequest)", phase)
		return
	}
	used := false
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && pass.TypesInfo.Uses[id] == key {
			used = true
		}
		return !used
	})
	if !used {
		pass.Reportf(pos, "%s never uses its idempotency key %s: send it with the effect (sdk.NewProviderRequest)", phase, key.Name())
		return
	}
	if flow != nil && !flow.paramReaches(fn, key) {
		pass.Reportf(pos, "%s never sends its idempotency key %s to the provider: it is used, but reaches no provider call "+
			"(sdk.NewProviderRequest, an http.Header, a client's key parameter): send it with the effect", phase, key.Name())
	}
}

// paramPos is the position of the i-th parameter of fd.
func paramPos(fd *ast.FuncDecl, i int) token.Pos {
	for _, f := range fd.Type.Params.List {
		n := len(f.Names)
		if n == 0 {
			n = 1
		}
		if i < n {
			if len(f.Names) > 0 {
				return f.Names[i].Pos()
			}
			return f.Type.Pos()
		}
		i -= n
	}
	return fd.Pos()
}

// checkDecisions checks every workflow's decision function and migration
// hook: the decide argument of sdk.HandleWorkflow and the argument of
// sdk.AcceptMigration. A decision is recorded, not replayed, but it runs
// again whenever its task is redelivered before its commit, and it is
// given nothing to reach the world with: whatever it reaches of the world
// (an effect, the machine's clock, a database of its own) is reported.
// A function literal or a function of the package is checked call by
// call; a function of another package at the registration, through its
// facts.
func checkDecisions(pass *analysis.Pass, funcs map[*types.Func]*funcInfo) {
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			fn, ok := typeutil.Callee(pass.TypesInfo, call).(*types.Func)
			if !ok || fn.Pkg() == nil || fn.Pkg().Path() != SDKPath {
				return true
			}
			arg := -1
			switch fn.Origin().Name() {
			case "HandleWorkflow":
				arg = 2
			case "AcceptMigration":
				arg = 0
			}
			if arg < 0 || len(call.Args) <= arg {
				return true
			}
			checkDecision(pass, funcs, call.Args[arg], fn.Origin().Name())
			return true
		})
	}
}

// checkDecision checks one decision function expression e, registered by
// the SDK function reg.
func checkDecision(pass *analysis.Pass, funcs map[*types.Func]*funcInfo, e ast.Expr, reg string) {
	report := func(pos token.Pos, name string, w Witness) {
		pass.Reportf(pos, "%s (%s): a decision reaches a %s: %s (a decision decides from its history alone: time is the history's Now, effects are steps)",
			name, reg, w.Kind, strings.Join(w.Path, " -> "))
	}
	if lit, ok := ast.Unparen(e).(*ast.FuncLit); ok {
		checkDecisionBody(pass, funcs, lit.Body, "a decision literal", report)
		return
	}
	var id *ast.Ident
	switch x := ast.Unparen(e).(type) {
	case *ast.Ident:
		id = x
	case *ast.SelectorExpr:
		id = x.Sel
	case *ast.IndexExpr: // an instantiated generic function
		if i, ok := x.X.(*ast.Ident); ok {
			id = i
		}
	}
	if id == nil {
		return // a function value: not followed
	}
	fn, ok := pass.TypesInfo.Uses[id].(*types.Func)
	if !ok {
		return
	}
	fn = fn.Origin()
	if fi, ok := funcs[fn]; ok && fi.decl.Body != nil && !fi.fixed {
		checkDecisionBody(pass, funcs, fi.decl.Body, funcName(fn), report)
		return
	}
	var eff Effects
	if fi, ok := funcs[fn]; ok {
		eff = fi.effects
	} else if !pass.ImportObjectFact(fn, &eff) {
		return
	}
	for _, w := range []Witness{eff.Unkeyed, eff.Keyed, eff.Impure} {
		if !w.zero() {
			report(e.Pos(), funcName(fn), w.via(funcName(fn)))
			return
		}
	}
}

// checkDecisionBody reports each call in body that reaches an effect, a
// clock read or a database.
func checkDecisionBody(pass *analysis.Pass, funcs map[*types.Func]*funcInfo, body *ast.BlockStmt, name string,
	report func(token.Pos, string, Witness)) {
	forEachCall(pass, body, func(call *ast.CallExpr, callee *types.Func) {
		e, via, ok := calleeEffects(pass, funcs, call, callee)
		if !ok {
			return
		}
		for _, w := range []Witness{e.Unkeyed, e.Keyed, e.Impure} {
			if !w.zero() {
				report(call.Pos(), name, w.via(via))
				return
			}
		}
	})
}
