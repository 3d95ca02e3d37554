// Package effectcheck is usher-vet's analyzer: it reports, in plugin code,
// what Go's types cannot stop a handler from doing.
//
//   - An effect outside the effect phase. A network call (package net's
//     Dial*, Listen* and Lookup*, net/http's client calls and servers,
//     net/smtp, sdk.NewProviderRequest), a file write (os.Create,
//     os.WriteFile, os.OpenFile with a write flag or a flag that is not a
//     constant, os.Mkdir*, os.Remove*, os.Rename, their os.Root
//     counterparts, ...), a process started (os/exec's Run, Start, Output,
//     CombinedOutput, os.StartProcess, syscall.Exec) or a call into a
//     function or package marked //usher:effect is reported when it is
//     reachable from a handler's Check, Commit, Apply or Claim, and from
//     Prepare unless it is declared //usher:idempotent-by-key. Only a
//     ClaimEffect's Effect may run any effect. A middleware (the Wrap
//     method of a type implementing sdk.Middleware, or a function literal
//     converted to sdk.MiddlewareFunc) runs in every phase, so any effect
//     it reaches is reported, keyed ones included.
//   - A workflow's decision that reaches the world: the decide function
//     given to sdk.HandleWorkflow and the hook given to
//     sdk.AcceptMigration may reach no effect (keyed ones included), no
//     clock (time.Now, time.Since, time.Until: time is the history's
//     Now) and no database of their own (database/sql). A function
//     literal or a function of the registering package is reported call
//     by call; a function of another package at its registration.
//   - sdk.KeyForTest outside a _test.go file.
//   - A ClaimEffect's Effect whose key never reaches the provider call:
//     the IdempotencyKey parameter is unnamed, named _, never used, or
//     used (a log line, an error, a helper that only logs it) but never
//     passed to a provider call. The key's value is followed through the
//     package's SSA: copies and conversions, key.String() and strings
//     built from it, what a call makes of it, struct fields and slice
//     elements it is stored in, closures that capture it, and the
//     parameters of the package's own functions it is passed to. It
//     reaches the provider when it is passed as sdk.NewProviderRequest's
//     key, as the value of an http.Header's Set or Add (or assigned to a
//     header by name), as a parameter of type sdk.IdempotencyKey of an
//     interface method or function value, to a function of another
//     package whose KeySink fact says that parameter reaches one, or, as
//     a key or a string, to a function of a package that does not import
//     the SDK (a provider's own client library, not followed: trusted).
//     The standard library is not trusted: a key that only reaches log,
//     fmt or errors does not reach the provider. A key kept in a global
//     is not followed, and is reported.
//
// Handlers are the methods of the types that implement sdk.StateFirst,
// sdk.ClaimEffect or sdk.RecordJobID, instantiated with the type arguments
// their methods use, generic handler types included. A named function
// converted to sdk.MiddlewareFunc is not followed.
//
// # How deep it looks
//
// Reachability follows static calls (functions, methods on concrete types,
// function literals in the body, go and defer statements) to any depth: in
// a package to a fixed point, and across packages through facts, so a
// handler calling a helper in another package of the module (or of a
// dependency) that calls os.WriteFile is reported. The standard library is
// not walked: its effects are the list above. Nor is the SDK: its handles
// go through the host, which enforces each phase's capability itself.
// Calls through interfaces and function values are not followed, so an
// effect behind an interface (an io.Writer that is a socket) is not seen.
//
// # Directives
//
// A directive is a comment line in a declaration's doc comment, with no
// space after the slashes:
//
//	//usher:effect
//
// on a func or method makes every call to it an effect; in the doc comment
// of a package clause, every function and method of the package.
//
//	//usher:idempotent-by-key
//
// on a func or method declares that what it does is keyed by the job (a
// store under a key derived from the order overwrites identical bytes): a
// call to it is allowed in Prepare, and still reported in the other
// phases.
//
//	//usher:no-effect reason
//
// on a func or method declares that what it does is not an effect of the
// job (a test hook writing marker files): calls to it are not reported.
// It is an escape hatch, visible in review; say why.
//
// Any other //usher: directive is reported, so a misspelt one does not
// silently change nothing.
package effectcheck
