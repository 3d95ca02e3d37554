// Package admin protects the host's admin API: the token it requires
// (where it is kept, how it is created and read) and the HTTP checks every
// request passes before it reaches an endpoint.
//
// The admin API reloads plugins, so a request that reaches it must come
// from the operator, not from a web page the operator happens to have open.
// Three checks, in this order:
//
//   - Host: the request's Host header must name the listener (its own
//     address, localhost, 127.0.0.1 or [::1], any port) or a name the
//     operator allowed. This defeats DNS rebinding, where a page at
//     attacker.example re-points its name at 127.0.0.1: the browser still
//     sends Host: attacker.example.
//   - Origin: a request carrying an Origin header (browsers send one on
//     every cross-site POST and on fetches) must come from the admin API's
//     own origin: the Origin's host and port are the Host header's, and
//     that host is allowed. The admin API serves no pages and answers no
//     CORS, so no other origin is legitimate.
//   - Token: every endpoint but /healthz requires Authorization: Bearer
//     <token>, compared in constant time; a missing or wrong token is a 401
//     with WWW-Authenticate: Bearer. /healthz stays open for liveness
//     probes (it says only "ok"), but passes the Host and Origin checks.
//     Paths under GuardConfig.SelfAuthPrefixes (the web console, which a
//     browser reaches without a bearer header) authenticate themselves
//     with the token or a session cookie got for it; see host/console.
package admin
