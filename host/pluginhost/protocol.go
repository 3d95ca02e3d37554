package pluginhost

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/go-plugin"

	"github.com/usherhq/usher/internal/contract"
)

// protocols maps every host-plugin protocol version this host speaks to
// the go-plugin plugin set that serves it. go-plugin's handshake offers all
// of them to the plugin, which picks the newest it also speaks.
//
// Adding protocol 2 is adding an entry (with its own shim when the contract
// changed); protocol 1's entry stays, so plugins built with an older SDK
// keep loading until 1 is removed on purpose.
func protocols(p *grpcPlugin) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		1: {contract.PluginName: p},
	}
}

// Protocols lists the protocol versions this host speaks, oldest first.
func Protocols() []int {
	var out []int
	for v := range protocols(&grpcPlugin{}) {
		out = append(out, v)
	}
	sort.Ints(out)
	return out
}

func protocolList() string {
	var s []string
	for _, v := range Protocols() {
		s = append(s, strconv.Itoa(v))
	}
	return strings.Join(s, ", ")
}

// go-plugin v1.8's refusal: "incompatible API version with plugin. Plugin
// version: 7, Client versions: [1]".
var incompatibleProtocol = regexp.MustCompile(`(?i)incompatible API version with plugin\. Plugin version: (\d+)`)

// protocolError rewrites go-plugin's refusal of a plugin built for another
// protocol into one that says which versions the host speaks; ok is false
// for any other error.
func protocolError(err error) (error, bool) {
	m := incompatibleProtocol.FindStringSubmatch(err.Error())
	if m == nil {
		return nil, false
	}
	return fmt.Errorf("the plugin speaks host-plugin protocol %s, this host speaks protocol %s; rebuild the plugin with an SDK for one of those: %w",
		m[1], protocolList(), err), true
}
