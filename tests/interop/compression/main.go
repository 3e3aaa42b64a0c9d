// Command compression runs the four compression test cases of the gRPC
// interop spec (doc/interop-test-descriptions.md in grpc/grpc) against a
// grpc.testing.TestService server, with the flags of grpc-go's interop client:
//
//	compression --server_host=127.0.0.1 --server_port=N --test_case=client_compressed_unary
//
// grpc-go's own interop client (google.golang.org/grpc/interop/client) has no
// compression cases ("Unsupported test case"), so this supplements it, built
// from the same grpc-go version. It exits 0 when the case passes; a failure
// prints what went wrong and exits 1.
//
// Two things grpc-go's client API cannot do are done around it:
//   - whether a response message arrived compressed: the compressor
//     registered as "gzip" here is grpc-go's own, wrapped to count the
//     messages it decompresses (grpc-go decompresses exactly the messages
//     whose compressed flag is set);
//   - sending one stream's messages compressed and uncompressed
//     (client_compressed_streaming): grpc-go compresses every message of a
//     call or none, so that call is written frame by frame over plaintext
//     HTTP/2 (golang.org/x/net/http2's Framer and HPACK).
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpccredentials "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcgzip "google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

var (
	serverHost = flag.String("server_host", "localhost", "the server host name (with port 0: a target, e.g. unix:PATH)")
	serverPort = flag.Int("server_port", 10000, "the server port number (0: server_host is the whole target)")
	testCase   = flag.String("test_case", "", "client_compressed_unary, server_compressed_unary, "+
		"client_compressed_streaming or server_compressed_streaming")
	timeout = flag.Duration("timeout", 10*time.Second, "deadline of the whole test case")
	// TLS, with the flags grpc-go's interop client has for it.
	useTLS       = flag.Bool("use_tls", false, "connect with TLS")
	caFile       = flag.String("ca_file", "", "with use_tls: the CA that signed the server's certificate")
	_            = flag.Bool("use_test_ca", false, "accepted as grpc-go's client takes it (which needs it to read --ca_file); --ca_file is always read here")
	hostOverride = flag.String("server_host_override", "", "with use_tls: the name the server's certificate must carry")
)

// tlsConfig is the client's TLS configuration (nil: plaintext).
func tlsConfig() *tls.Config {
	if !*useTLS {
		return nil
	}
	pem, err := os.ReadFile(*caFile)
	if err != nil {
		fail("reading --ca_file: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		fail("--ca_file %s holds no certificate", *caFile)
	}
	return &tls.Config{RootCAs: roots, ServerName: *hostOverride, NextProtos: []string{"h2"}}
}

// decompressed counts the messages grpc-go decompressed with "gzip".
var decompressed atomic.Int64

type countingCompressor struct{ encoding.Compressor }

func (c countingCompressor) Decompress(r io.Reader) (io.Reader, error) {
	decompressed.Add(1)
	return c.Compressor.Decompress(r)
}

func init() {
	encoding.RegisterCompressor(countingCompressor{encoding.GetCompressor(grpcgzip.Name)})
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s FAILED: %s\n", *testCase, fmt.Sprintf(format, args...))
	os.Exit(1)
}

func zeros(n int) *testpb.Payload {
	return &testpb.Payload{Type: testpb.PayloadType_COMPRESSABLE, Body: make([]byte, n)}
}

func main() {
	flag.Parse()
	// As grpc-go's interop client: port 0 dials server_host as it is.
	address := *serverHost
	if *serverPort != 0 {
		address = net.JoinHostPort(*serverHost, strconv.Itoa(*serverPort))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	credentials := insecure.NewCredentials()
	if config := tlsConfig(); config != nil {
		credentials = grpccredentials.NewTLS(config)
	}
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(credentials))
	if err != nil {
		fail("grpc.NewClient(%q): %v", address, err)
	}
	defer conn.Close()
	client := testgrpc.NewTestServiceClient(conn)
	switch *testCase {
	case "client_compressed_unary":
		clientCompressedUnary(ctx, client)
	case "server_compressed_unary":
		serverCompressedUnary(ctx, client)
	case "client_compressed_streaming":
		clientCompressedStreaming(ctx, client, address)
	case "server_compressed_streaming":
		serverCompressedStreaming(ctx, client)
	default:
		fmt.Fprintf(os.Stderr, "unsupported test case %q\n", *testCase)
		os.Exit(2)
	}
	fmt.Printf("%s done\n", *testCase)
}

func checkSimpleResponse(step string, reply *testpb.SimpleResponse, err error) {
	if err != nil {
		fail("%s: UnaryCall: %v", step, err)
	}
	if size := len(reply.GetPayload().GetBody()); size != 314159 {
		fail("%s: response payload of %d bytes, want 314159", step, size)
	}
}

func clientCompressedUnary(ctx context.Context, client testgrpc.TestServiceClient) {
	request := func(expectCompressed bool) *testpb.SimpleRequest {
		return &testpb.SimpleRequest{
			ResponseType:     testpb.PayloadType_COMPRESSABLE,
			ResponseSize:     314159,
			Payload:          zeros(271828),
			ExpectCompressed: &testpb.BoolValue{Value: expectCompressed},
		}
	}
	// 1. The probe: expect_compressed, sent uncompressed.
	_, err := client.UnaryCall(ctx, request(true))
	if status.Code(err) != codes.InvalidArgument {
		fail("probe (uncompressed request with expect_compressed): got %v, want INVALID_ARGUMENT", err)
	}
	// 2. expect_compressed, sent compressed.
	reply, err := client.UnaryCall(ctx, request(true), grpc.UseCompressor(grpcgzip.Name))
	checkSimpleResponse("compressed request with expect_compressed", reply, err)
	// 3. Not expected compressed, sent uncompressed.
	reply, err = client.UnaryCall(ctx, request(false))
	checkSimpleResponse("uncompressed request without expect_compressed", reply, err)
}

func serverCompressedUnary(ctx context.Context, client testgrpc.TestServiceClient) {
	for _, compressed := range []bool{true, false} {
		step := fmt.Sprintf("response_compressed=%v", compressed)
		before := decompressed.Load()
		reply, err := client.UnaryCall(ctx, &testpb.SimpleRequest{
			ResponseType:       testpb.PayloadType_COMPRESSABLE,
			ResponseSize:       314159,
			Payload:            zeros(271828),
			ResponseCompressed: &testpb.BoolValue{Value: compressed},
		})
		checkSimpleResponse(step, reply, err)
		if got := decompressed.Load()-before == 1; got != compressed {
			fail("%s: the response's compressed flag is %v", step, got)
		}
	}
}

func serverCompressedStreaming(ctx context.Context, client testgrpc.TestServiceClient) {
	want := []struct {
		compressed bool
		size       int
	}{{true, 31415}, {false, 92653}}
	parameters := make([]*testpb.ResponseParameters, len(want))
	for i, w := range want {
		parameters[i] = &testpb.ResponseParameters{Size: int32(w.size), Compressed: &testpb.BoolValue{Value: w.compressed}}
	}
	stream, err := client.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{
		ResponseType:       testpb.PayloadType_COMPRESSABLE,
		ResponseParameters: parameters,
	})
	if err != nil {
		fail("StreamingOutputCall: %v", err)
	}
	for i, w := range want {
		before := decompressed.Load()
		reply, err := stream.Recv()
		if err != nil {
			fail("response %d: %v", i, err)
		}
		if size := len(reply.GetPayload().GetBody()); size != w.size {
			fail("response %d: payload of %d bytes, want %d", i, size, w.size)
		}
		if got := decompressed.Load()-before == 1; got != w.compressed {
			fail("response %d: compressed flag %v, want %v", i, got, w.compressed)
		}
	}
	if _, err := stream.Recv(); err != io.EOF {
		fail("after two responses: got %v, want the end of the stream with OK", err)
	}
}

func clientCompressedStreaming(ctx context.Context, client testgrpc.TestServiceClient, address string) {
	// 1. The probe: one uncompressed message with expect_compressed.
	probe, err := client.StreamingInputCall(ctx)
	if err != nil {
		fail("probe: StreamingInputCall: %v", err)
	}
	if err := probe.Send(&testpb.StreamingInputCallRequest{
		Payload:          zeros(27182),
		ExpectCompressed: &testpb.BoolValue{Value: true},
	}); err != nil && err != io.EOF {
		fail("probe: Send: %v", err)
	}
	if _, err := probe.CloseAndRecv(); status.Code(err) != codes.InvalidArgument {
		fail("probe (uncompressed message with expect_compressed): got %v, want INVALID_ARGUMENT", err)
	}
	// 2. A compressed message expected compressed, then an uncompressed one
	// not expected compressed, in one call.
	first, _ := proto.Marshal(&testpb.StreamingInputCallRequest{
		Payload:          zeros(27182),
		ExpectCompressed: &testpb.BoolValue{Value: true},
	})
	second, _ := proto.Marshal(&testpb.StreamingInputCallRequest{
		Payload:          zeros(45904),
		ExpectCompressed: &testpb.BoolValue{Value: false},
	})
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(first)
	w.Close()
	body := append(grpcFrame(1, gz.Bytes()), grpcFrame(0, second)...)
	deadline, _ := ctx.Deadline()
	code, message, reply, err := rawCall(address, "/grpc.testing.TestService/StreamingInputCall", body, deadline)
	if err != nil {
		fail("mixed stream: %v", err)
	}
	if code != "0" {
		fail("mixed stream: grpc-status %s (%q), want 0", code, message)
	}
	response := &testpb.StreamingInputCallResponse{}
	if err := proto.Unmarshal(reply, response); err != nil {
		fail("mixed stream: response: %v", err)
	}
	if got := response.GetAggregatedPayloadSize(); got != 27182+45904 {
		fail("mixed stream: aggregated_payload_size %d, want %d", got, 27182+45904)
	}
}

// grpcFrame is one length-prefixed gRPC message.
func grpcFrame(flag byte, message []byte) []byte {
	frame := make([]byte, 5, 5+len(message))
	frame[0] = flag
	binary.BigEndian.PutUint32(frame[1:], uint32(len(message)))
	return append(frame, message...)
}

// rawCall makes one gRPC call with grpc-encoding gzip over a new plaintext
// HTTP/2 connection, sending body (already framed) and half-closing; it
// returns grpc-status, grpc-message and the one response message.
func rawCall(address, path string, body []byte, deadline time.Time) (code, message string, reply []byte, err error) {
	network, dial := "tcp", address
	if path, ok := strings.CutPrefix(address, "unix:"); ok {
		network, dial = "unix", path
	}
	var conn net.Conn
	dialer := &net.Dialer{Timeout: time.Until(deadline)}
	if config := tlsConfig(); config != nil {
		conn, err = tls.DialWithDialer(dialer, network, dial, config)
	} else {
		conn, err = dialer.Dial(network, dial)
	}
	if err != nil {
		return "", "", nil, err
	}
	defer conn.Close()
	conn.SetDeadline(deadline)
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		return "", "", nil, err
	}
	framer := http2.NewFramer(conn, conn)
	framer.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := framer.WriteSettings(); err != nil {
		return "", "", nil, err
	}
	// The server's SETTINGS come first: they bound what may be sent.
	maxFrame, window := uint32(16384), uint32(65535)
	for {
		frame, err := framer.ReadFrame()
		if err != nil {
			return "", "", nil, fmt.Errorf("waiting for the server's SETTINGS: %w", err)
		}
		settings, ok := frame.(*http2.SettingsFrame)
		if !ok || settings.IsAck() {
			continue
		}
		if v, ok := settings.Value(http2.SettingMaxFrameSize); ok {
			maxFrame = v
		}
		if v, ok := settings.Value(http2.SettingInitialWindowSize); ok {
			window = min(window, v) // the connection's window stays 65535
		}
		if err := framer.WriteSettingsAck(); err != nil {
			return "", "", nil, err
		}
		break
	}
	if uint32(len(body)) > window {
		return "", "", nil, fmt.Errorf("%d bytes to send, the server's window is %d", len(body), window)
	}
	var headers bytes.Buffer
	encoder := hpack.NewEncoder(&headers)
	for _, field := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", address},
		{"content-type", "application/grpc"}, {"te", "trailers"},
		{"grpc-encoding", "gzip"}, {"grpc-accept-encoding", "gzip"},
		{"grpc-timeout", strconv.FormatInt(time.Until(deadline).Milliseconds(), 10) + "m"},
	} {
		encoder.WriteField(hpack.HeaderField{Name: field[0], Value: field[1]})
	}
	const stream = 1
	if err := framer.WriteHeaders(http2.HeadersFrameParam{
		StreamID: stream, BlockFragment: headers.Bytes(), EndHeaders: true,
	}); err != nil {
		return "", "", nil, err
	}
	for len(body) > 0 {
		n := min(len(body), int(maxFrame))
		if err := framer.WriteData(stream, n == len(body), body[:n]); err != nil {
			return "", "", nil, err
		}
		body = body[n:]
	}
	var data []byte
	encodingName := ""
	for {
		frame, err := framer.ReadFrame()
		if err != nil {
			return "", "", nil, fmt.Errorf("reading the response: %w", err)
		}
		switch f := frame.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				framer.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				framer.WritePing(true, f.Data)
			}
		case *http2.GoAwayFrame:
			return "", "", nil, fmt.Errorf("GOAWAY %v", f.ErrCode)
		case *http2.RSTStreamFrame:
			return "", "", nil, fmt.Errorf("RST_STREAM %v", f.ErrCode)
		case *http2.DataFrame:
			data = append(data, f.Data()...)
			if n := uint32(len(f.Data())); n > 0 {
				framer.WriteWindowUpdate(0, n)
				framer.WriteWindowUpdate(stream, n)
			}
		case *http2.MetaHeadersFrame:
			for _, field := range f.Fields {
				switch field.Name {
				case "grpc-status":
					code = field.Value
				case "grpc-message":
					message = field.Value
				case "grpc-encoding":
					encodingName = field.Value
				}
			}
			if f.StreamEnded() {
				reply, err := decodeReply(data, encodingName)
				return code, message, reply, err
			}
		}
	}
}

// decodeReply is the one message of a unary response's DATA (none with a
// non-OK status).
func decodeReply(data []byte, encodingName string) ([]byte, error) {
	if len(data) == 0 {
		return nil, nil
	}
	if len(data) < 5 || int(binary.BigEndian.Uint32(data[1:5])) != len(data)-5 {
		return nil, fmt.Errorf("not one length-prefixed message: %d bytes", len(data))
	}
	if data[0] == 0 {
		return data[5:], nil
	}
	if encodingName != "gzip" {
		return nil, errors.New("compressed response with grpc-encoding " + strconv.Quote(encodingName))
	}
	r, err := gzip.NewReader(bytes.NewReader(data[5:]))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}
