// The job's TLS credentials (docs/SECURITY.md): every node derives the job's CA key from the job's
// secret (HKDF-SHA256 -> an Ed25519 key), makes a key of its own and a certificate for it signed
// by that CA, and trusts only that CA. A peer without the secret cannot show such a certificate,
// so its TLS handshake fails before CAF parses a byte from it. Neither the secret nor the node's
// key goes to disk: the credentials live in this object's memory (PEM), which the node's TLS
// context reads once.
#pragma once

#include <memory>
#include <string>

#include "zmuon/status.hpp"

namespace zmuon {

/// The shortest secret a job may have (bytes).
inline constexpr size_t kMinSecretBytes = 16;

/// How the nodes of a job reach each other. Plain TCP only where the user asks for it; by default
/// only on loopback addresses, where no other host can reach the ports.
enum class node_transport { tls, insecure_loopback, insecure_any_host };

/// Certificates that the peers must refuse, to show that they do (tests only).
enum class test_certificate { valid, expired, foreign_ca };

class tls_credentials {
public:
  /// The files for a node of the job whose secret is `secret` (at least kMinSecretBytes).
  static expected<std::unique_ptr<tls_credentials>> make(
      const std::string& secret, test_certificate kind = test_certificate::valid);
  ~tls_credentials();
  tls_credentials(const tls_credentials&) = delete;
  tls_credentials& operator=(const tls_credentials&) = delete;

  const std::string& ca_pem() const { return ca_pem_; }      // the job's CA
  const std::string& cert_pem() const { return cert_pem_; }  // this node's certificate
  const std::string& key_pem() const { return key_pem_; }    // this node's key (wiped at the end)

private:
  tls_credentials() = default;
  std::string ca_pem_, cert_pem_, key_pem_;
};

/// A new random secret: 32 bytes from the system's generator, as 64 hex digits.
std::string random_secret();

/// The job's secret: the first line of the file at `secret_file` when given, else
/// $ZMUON_JOB_SECRET, else the first line of the file named by $ZMUON_JOB_SECRET_FILE; "" when
/// none is set. A secret shorter than kMinSecretBytes, or a file that is not a regular file or
/// that others may read, is an error.
expected<std::string> read_job_secret(const std::string& secret_file = {});

}  // namespace zmuon
