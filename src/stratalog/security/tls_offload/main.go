// stratalog-tls-offload: TLS termination for a Stratalog listener, in a process of its own.
//
// The broker is a Python process whose event loop does every connection's work; decrypting
// and encrypting there costs the loop a copy of every byte and the interpreter's lock, and
// TLS connections cannot use sendfile. This process accepts the listener's TLS connections
// (the broker's certificate, and for mutual TLS its truststore), and hands each one, in clear,
// to the broker over a Unix socket only the broker's user can reach, after a PROXY protocol v2
// header that carries the client's address and, when one was verified, its certificate (DER,
// TLV 0xE0) from which the broker takes the principal as it does for its own TLS.
//
// The certificate chain and the private key come on standard input (a 4-byte big-endian length,
// then PEM blocks), never from a file: the broker has already decrypted the key
// (ssl.key.password). It prints "listening HOST:PORT" once bound, and exits when its standard
// input closes (the broker went away), so it never outlives the broker.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

const copyBuffer = 256 << 10

var signature = []byte("\r\n\r\n\x00\r\nQUIT\n")

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to accept TLS connections on")
	ca := flag.String("ca", "", "PEM file of the CAs client certificates must chain to")
	clientAuth := flag.String("client-auth", "none", "none, requested or required")
	upstream := flag.String("upstream", "", "the broker's Unix socket")
	handshake := flag.Duration("handshake-timeout", 10*time.Second, "a TLS handshake's bound")
	versions := flag.String("protocols", "TLSv1.2,TLSv1.3", "TLS versions allowed (ssl.enabled.protocols)")
	flag.Parse()
	var size [4]byte
	_, err := io.ReadFull(os.Stdin, size[:])
	fail(err, "keystore on stdin")
	pem := make([]byte, binary.BigEndian.Uint32(size[:]))
	_, err = io.ReadFull(os.Stdin, pem)
	fail(err, "keystore on stdin")
	pair, err := tls.X509KeyPair(pem, pem)
	fail(err, "keystore")
	config := &tls.Config{Certificates: []tls.Certificate{pair}}
	config.MinVersion, config.MaxVersion = protocols(*versions)
	switch *clientAuth {
	case "none":
	case "requested":
		config.ClientAuth = tls.VerifyClientCertIfGiven
	case "required":
		config.ClientAuth = tls.RequireAndVerifyClientCert
	default:
		fail(fmt.Errorf("unknown -client-auth %q", *clientAuth), "options")
	}
	if *ca != "" {
		pem, err := os.ReadFile(*ca)
		fail(err, "truststore")
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fail(errors.New("no certificate in it"), "truststore")
		}
		config.ClientCAs = pool
	}
	ln, err := net.Listen("tcp", *listen)
	fail(err, "listen")
	fmt.Printf("listening %s\n", ln.Addr())
	go func() { // the broker holds our stdin: when it goes, so do we
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			continue
		}
		go serve(c.(*net.TCPConn), config, *upstream, *handshake)
	}
}

// protocols is the lowest and highest of a comma-separated list of TLSv1.2 and TLSv1.3.
func protocols(list string) (uint16, uint16) {
	known := map[string]uint16{"TLSv1.2": tls.VersionTLS12, "TLSv1.3": tls.VersionTLS13}
	var low, high uint16
	for _, name := range strings.Split(list, ",") {
		v, ok := known[strings.TrimSpace(name)]
		if !ok {
			fail(fmt.Errorf("unknown protocol %q", name), "options")
		}
		if low == 0 || v < low {
			low = v
		}
		if v > high {
			high = v
		}
	}
	return low, high
}

func fail(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "stratalog-tls-offload: %s: %v\n", what, err)
		os.Exit(2)
	}
}

func serve(raw *net.TCPConn, config *tls.Config, upstream string, bound time.Duration) {
	defer raw.Close()
	raw.SetNoDelay(true)
	conn := tls.Server(raw, config)
	raw.SetDeadline(time.Now().Add(bound))
	if err := conn.Handshake(); err != nil {
		return // the client sees the alert; the broker never hears of it
	}
	raw.SetDeadline(time.Time{})
	var der []byte
	if peers := conn.ConnectionState().PeerCertificates; len(peers) > 0 {
		der = peers[0].Raw // verified by the handshake (ClientCAs)
	}
	addr, err := net.ResolveUnixAddr("unix", upstream)
	if err != nil {
		return
	}
	broker, err := net.DialUnix("unix", nil, addr)
	if err != nil {
		return
	}
	defer broker.Close()
	if _, err := broker.Write(header(raw.RemoteAddr().(*net.TCPAddr), raw.LocalAddr().(*net.TCPAddr), der)); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		toBroker(broker, conn, raw)
		broker.CloseWrite()
		close(done)
	}()
	io.CopyBuffer(conn, broker, make([]byte, copyBuffer))
	conn.CloseWrite()
	<-done
}

// toBroker copies the client's bytes to the broker, a write for all the records that have
// arrived rather than one per TLS record: a client's records can be small (librdkafka writes
// each piece of a request on its own), and each write wakes the broker's event loop, whose
// per-read cost is what this process is there to save. After a read that waited, the records
// already received are taken without waiting (an expired read deadline ends the round).
func toBroker(broker *net.UnixConn, conn *tls.Conn, raw *net.TCPConn) {
	buf := make([]byte, copyBuffer)
	past := time.Unix(1, 0)
	for {
		n, err := conn.Read(buf)
		if n > 0 && err == nil {
			conn.SetReadDeadline(past)
			for n < len(buf) {
				m, more := conn.Read(buf[n:])
				n += m
				if more != nil {
					var timeout net.Error
					if !errors.As(more, &timeout) || !timeout.Timeout() {
						err = more
					}
					break
				}
			}
			conn.SetReadDeadline(time.Time{})
		}
		if n > 0 {
			if _, werr := broker.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// header is a PROXY protocol v2 header (PROXY command, TCP) with the client's certificate in
// TLV 0xE0 when there is one.
func header(src, dst *net.TCPAddr, der []byte) []byte {
	var addrs []byte
	family := byte(0x11) // TCP over IPv4
	if s4, d4 := src.IP.To4(), dst.IP.To4(); s4 != nil && d4 != nil {
		addrs = append(append(addrs, s4...), d4...)
	} else {
		family = 0x21 // TCP over IPv6
		addrs = append(append(addrs, src.IP.To16()...), dst.IP.To16()...)
	}
	addrs = binary.BigEndian.AppendUint16(addrs, uint16(src.Port))
	addrs = binary.BigEndian.AppendUint16(addrs, uint16(dst.Port))
	if der != nil {
		addrs = append(addrs, 0xE0)
		addrs = binary.BigEndian.AppendUint16(addrs, uint16(len(der)))
		addrs = append(addrs, der...)
	}
	out := append([]byte{}, signature...)
	out = append(out, 0x21, family)
	out = binary.BigEndian.AppendUint16(out, uint16(len(addrs)))
	return append(out, addrs...)
}
