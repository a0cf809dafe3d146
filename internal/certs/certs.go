// Package certs makes throw-away X.509 material: a CA, and server and client
// certificates signed by it. The demo uses it when no certificate is given
// and the tests use it for every TLS case (expired, wrong host, ...).
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// CA is a certificate authority held in memory.
type CA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
}

// Pair is a certificate with its key, both PEM-encoded.
type Pair struct {
	CertPEM, KeyPEM []byte
}

// TLS parses the pair into a tls.Certificate.
func (p Pair) TLS() (tls.Certificate, error) { return tls.X509KeyPair(p.CertPEM, p.KeyPEM) }

// NewCA makes a CA valid from an hour ago for ten years.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("ca cert: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Pool returns a cert pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// localHosts are the names a server on the loopback is reached by: the Go
// client dials 127.0.0.1, and the Lua tests verify against "localhost".
// SRV tests name LocalTarget, which only the test's own DNS server
// answers: "localhost" is in /etc/hosts, which Go's resolver reads first,
// and a stock Debian 12 lists it for ::1 too.
var localHosts = []string{"localhost", "127.0.0.1", LocalTarget}

// LocalTarget is a name the local server certificate is for and no
// system resolver knows: a test's DNS server maps it to the loopback.
const LocalTarget = "target.qrpc.test"

// IssueLocal signs a server certificate for localHosts, parsed for
// crypto/tls (test servers need it in that form only).
func (ca *CA) IssueLocal() (tls.Certificate, error) {
	pair, err := ca.Issue(Options{Hosts: localHosts})
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := pair.TLS()
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parse local server cert: %w", err)
	}
	return cert, nil
}

// NewLocal makes a CA named name and a server certificate it signed for
// localHosts: what every test with a real TLS server on 127.0.0.1 starts
// with.
func NewLocal(name string) (*CA, tls.Certificate, error) {
	ca, err := NewCA(name)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	cert, err := ca.IssueLocal()
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	return ca, cert, nil
}

// Options shape a leaf certificate.
type Options struct {
	Hosts     []string // DNS names or IP addresses
	Client    bool     // client auth instead of server auth
	NotBefore time.Time
	NotAfter  time.Time
}

// Issue signs a leaf certificate. Zero times mean "valid now for a year".
func (ca *CA) Issue(o Options) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("leaf key: %w", err)
	}
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().AddDate(1, 0, 0)
	}
	cn := "qrpc"
	if len(o.Hosts) > 0 {
		cn = o.Hosts[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if o.Client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Pair{}, fmt.Errorf("leaf cert: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}
