// Package console is the host's web console: server-rendered pages on the
// admin listener, under /console/, for an operator's browser.
//
// Pages: an overview (job throughput, mean run duration, and retries,
// reclaims and republishes per kind over time, and duplicates absorbed per
// guard, drawn as SVG from the job history every host writes, bucketed by
// ops.Throughput and ops.Republishes, so every host's console shows the
// cluster and the charts outlive outbox retention; over a range chosen
// with ?range= (the configured window, 1h, 6h, 24h, 7d) in about 60
// buckets; kinds busiest first, the idle ones this host serves last; and
// the state `host inspect` prints: pending, lag, oldest pending age, relay
// lag, open dead letters, absorbed duplicates); dead letters (filter by kind, show, requeue one, the ticked
// ones or every one of a kind, discard one; 200 a page with the total);
// plugins (version, checksum, health, restarts, in flight, parked now and
// in total, probation and rollback, the swap history of host/swaps;
// reload, roll back, and pause or resume each kind); workflows (200 a
// page with the total, one workflow's timeline); and jobs (outbox rows
// searched by id, kind, outcome, request id,
// creation time and the last error's text, 200 a page with the total, and
// for one job id its state, its payload (the first 4 KiB pretty-printed,
// the whole a download; said gone once retention deleted it), every
// delivery's record and the operator actions on it, with cancel and run
// now; for a request id its jobs as a tree and on the durable workflows'
// timeline, a bar per delivery). The overview, the jobs, a job's, the dead
// letters' and the workflows' pages refresh their parts in place
// (console.js, data-live) until what they show is final. Attempts read as
// the history numbers them, "0 (1st)", and durations humanised
// (ops.Attempt, ops.HumanDuration), as in the CLI. Every action is the
// CLI's (host/jobctl, host/pause, the fleet's rollback) and is recorded in
// operator_actions with who acted: the name the operator gave at login (or
// on the action's form as by=; "operator" if none) and the caller's
// address, "ada via the console from 10.0.0.7:51234", as the admin API
// records "NAME via the admin API from ADDR". Every number
// comes from the functions the CLI uses: host/ops for the state and the
// charts, host/deadletter for dead letters, host/history for a job's
// history, the host's PluginReport and Reload for plugins.
//
// # Authentication and CSRF
//
// The admin listener's guard (host/admin) checks Host and Origin on every
// request as for the API, but lets /console/ through without a bearer
// token: a browser cannot send one on navigation. The console asks for the
// admin token once, on its login form, and answers with a session cookie:
// random, HttpOnly, SameSite=Strict, Path=/console/, Secure when served
// over TLS, valid 12 hours or until logout or the host stops (sessions are
// kept in memory). A request may instead carry the bearer token, as the API
// takes it (for scripts).
//
// Every POST (login, logout and every action) must also show it comes from
// the console's own pages: an Origin header naming this listener (the
// guard has already refused any other origin), or Sec-Fetch-Site:
// same-origin; a POST with neither is refused unless it carries the bearer
// token. With the SameSite=Strict cookie a cross-site form cannot act with
// the operator's session, and the Origin check refuses it even from a
// same-site page on another port.
//
// No asset comes from a CDN: the templates, the stylesheet and a few lines
// of JavaScript are embedded, and charts are SVG drawn here.
package console
