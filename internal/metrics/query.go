package metrics

import "fmt"

// Query answers the host's metrics request (QRPC_OP_METRICS): what is
//
//	""          this worker's figures, Prometheus text format
//	"snapshot"  this worker's figures, snapshot format (for the dict)
//	"render"    the text format of body: "key value" lines summed over workers
func (r *Registry) Query(what string, body []byte) ([]byte, error) {
	switch what {
	case "":
		return r.Text(), nil
	case "snapshot":
		return r.Snapshot(), nil
	case "render":
		return Render(body)
	}
	return nil, fmt.Errorf("metrics: unknown query %q (\"\", \"snapshot\" or \"render\")", what)
}
