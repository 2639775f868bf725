// Command xds_multi is the gRPC-Go app of the agent's multi-stream proxyless test.
//
//	xds_multi server PORT...                        plain-text health servers, one per port; every
//	                                                answer carries the header x-endpoint: <port>
//	xds_multi client DURATION INTERVAL TARGET...    one channel per xds:/// target (gRPC-Go opens one
//	                                                xDS client, so one ADS stream, per target), a
//	                                                health check on each every INTERVAL for DURATION
//
// The client prints `target=<t> endpoint=<port>` whenever the endpoint answering a target
// changes, `target=<t> error=<e>` whenever a target starts failing, and at the end
// `done calls=<n> errors=<n>`. It exits 0 unless it cannot start.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and its balancers
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "server":
		err = serve(os.Args[2:])
	case "client":
		err = client(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: xds_multi server PORT... | client DURATION INTERVAL TARGET...")
	os.Exit(2)
}

func serve(ports []string) error {
	if len(ports) == 0 {
		return fmt.Errorf("no port given")
	}
	errs := make(chan error, len(ports))
	for _, port := range ports {
		lis, err := net.Listen("tcp", "127.0.0.1:"+port)
		if err != nil {
			return err
		}
		tag := port
		srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := grpc.SetHeader(ctx, metadata.Pairs("x-endpoint", tag)); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}))
		healthpb.RegisterHealthServer(srv, health.NewServer())
		fmt.Printf("serving port=%s\n", port)
		go func() { errs <- srv.Serve(lis) }()
	}
	return <-errs
}

func client(args []string) error {
	if len(args) < 3 {
		usage()
	}
	duration, err := time.ParseDuration(args[0])
	if err != nil {
		return fmt.Errorf("duration %q: %w", args[0], err)
	}
	interval, err := time.ParseDuration(args[1])
	if err != nil {
		return fmt.Errorf("interval %q: %w", args[1], err)
	}
	targets := args[2:]
	conns := make([]*grpc.ClientConn, len(targets))
	for i, t := range targets {
		conn, err := grpc.NewClient(t, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("channel to %s: %w", t, err)
		}
		defer conn.Close()
		conns[i] = conn
	}
	fmt.Printf("started channels=%d\n", len(conns))

	var mu sync.Mutex // one line at a time on stdout
	var calls, failures int
	var wg sync.WaitGroup
	deadline := time.Now().Add(duration)
	for i, conn := range conns {
		wg.Add(1)
		go func(target string, conn *grpc.ClientConn) {
			defer wg.Done()
			hc := healthpb.NewHealthClient(conn)
			last := ""
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				var md metadata.MD
				_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
				cancel()
				state := ""
				if err != nil {
					state = "error=" + strconv.Quote(err.Error())
				} else if v := md.Get("x-endpoint"); len(v) == 1 {
					state = "endpoint=" + v[0]
				} else {
					state = "error=\"no x-endpoint header\""
				}
				mu.Lock()
				calls++
				if err != nil {
					failures++
				}
				if state != last {
					fmt.Printf("target=%s %s\n", target, state)
					last = state
				}
				mu.Unlock()
				time.Sleep(interval)
			}
		}(targets[i], conn)
	}
	wg.Wait()
	fmt.Printf("done calls=%d errors=%d\n", calls, failures)
	return nil
}
