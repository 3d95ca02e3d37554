package contract

import "strings"

// WorkflowKindPrefix begins the kind of every workflow type's decision
// tasks: a plugin serving workflow type "checkout" serves the kind
// "usher.workflow.checkout" under the workflow guard, and its manifest
// lists that kind like any other.
const WorkflowKindPrefix = "usher.workflow."

// WorkflowKind is the kind of workflow type typ's decision tasks.
func WorkflowKind(typ string) string { return WorkflowKindPrefix + typ }

// WorkflowType is the workflow type whose decision tasks have kind, and
// whether kind is one.
func WorkflowType(kind string) (string, bool) {
	t, ok := strings.CutPrefix(kind, WorkflowKindPrefix)
	return t, ok && t != ""
}
