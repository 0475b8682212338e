package stack

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
)

// ScrapeMetrics reads kubescribe's /metrics at opsURL (its ops listener, Stack.OpsURL) into its
// samples, by their whole name: "name" or "name{labels}". Comments, and samples that are not a
// number (NaN), are left out.
func ScrapeMetrics(opsURL string) (map[string]float64, error) {
	resp, err := http.Get(opsURL + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: %s", opsURL, resp.Status)
	}
	return ParseMetrics(b), nil
}

// ParseMetrics reads a page in Prometheus' text format (kubescribe's or an apiserver's) into
// its samples, as ScrapeMetrics does.
func ParseMetrics(b []byte) map[string]float64 {
	m := map[string]float64{}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		i := bytes.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(string(line[i+1:]), 64)
		if err != nil || math.IsNaN(v) {
			continue
		}
		m[string(line[:i])] = v
	}
	return m
}
