// The job's TLS credentials (docs/SECURITY.md): every node derives the job's CA key from the job's
// secret and salt (scrypt -> Ed25519 key), makes a key of its own and a certificate for it signed
// by that CA, and trusts only that CA. A peer without the secret cannot show such a certificate,
// so its TLS handshake fails before CAF parses a byte from it. Neither the secret nor the node's
// key goes to disk: the credentials live in this object's memory (PEM), which the node's TLS
// context reads once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "zmuon/status.hpp"

namespace zmuon {

/// The shortest secret a job may have (bytes).
inline constexpr size_t kMinSecretBytes = 16;

/// The least estimated strength of a secret (estimated_secret_bits), --weak-secret-ok aside: 16
/// random bytes as 32 hex digits (128 bits) pass, with room for a chance run like "abcd".
inline constexpr double kMinSecretBits = 120;

/// The scrypt work factor of the CA key's derivation: N = 2^15, r = 8, p = 1, i.e. 32 MiB and
/// about 0.1 s of a core. A node pays it once; an attacker with a certificate once per guess
/// (docs/SECURITY.md).
struct scrypt_cost {
  uint64_t n = uint64_t{1} << 15;
  uint32_t r = 8;
  uint32_t p = 1;
  /// The memory one derivation needs at least (bytes): 128 * r * N.
  uint64_t memory() const { return 128 * uint64_t{r} * n; }
};
inline constexpr scrypt_cost kScryptCost{};

/// How long the certificates outlive the join's deadline: for clocks of the nodes this far apart.
inline constexpr long kCertificateMarginSeconds = 600;

/// How the nodes of a job reach each other. Plain TCP only where the user asks for it; by default
/// only on loopback addresses, where no other host can reach the ports.
enum class node_transport { tls, insecure_loopback, insecure_any_host };

/// Certificates that the peers must refuse, to show that they do (tests only).
enum class test_certificate { valid, expired, foreign_ca };

class tls_credentials {
public:
  /// The files for a node of the job whose secret is `secret` (at least kMinSecretBytes) and
  /// salt `salt` (job_salt). The node's certificate is valid until `join_timeout_ms` plus
  /// kCertificateMarginSeconds from now: every connection of the job opens during the join.
  static expected<std::unique_ptr<tls_credentials>> make(
      const std::string& secret, const std::string& salt, int64_t join_timeout_ms,
      test_certificate kind = test_certificate::valid);
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

/// Writes a new secret (random_secret and a line end) to `path`, mode 0600; a file already there
/// is left as it was and is an error.
error write_new_secret(const std::string& path);

/// The job's secret: the first line of the file at `secret_file` when given, else
/// $ZMUON_JOB_SECRET, else the first line of the file named by $ZMUON_JOB_SECRET_FILE; "" when
/// none is set. A secret shorter than kMinSecretBytes, or a file that is not a regular file or
/// that others may read, is an error.
expected<std::string> read_job_secret(const std::string& secret_file = {});

/// Where read_job_secret(secret_file) takes the secret from, for messages: "the file 'F'",
/// "$ZMUON_JOB_SECRET" or "the file 'F' ($ZMUON_JOB_SECRET_FILE)".
std::string job_secret_source(const std::string& secret_file = {});

/// An estimate of the bits an attacker must guess (an upper bound for a secret of words): its
/// length, less the characters that continue a repeat or a run ("aaaa", "abcd", "abab"), times
/// log2 of its alphabet, the smaller of the character classes it uses (16 for hex digits) and
/// twice its distinct characters.
double estimated_secret_bits(const std::string& secret);

/// Refuses a secret shorter than kMinSecretBytes, or one estimated under kMinSecretBits, naming
/// the problem and `from`; with `weak_ok` (--weak-secret-ok, $ZMUON_WEAK_SECRET_OK=1) only the
/// length is checked and a weak secret is let through with a warning.
error check_job_secret(const std::string& secret, const std::string& from, bool weak_ok);

/// The salt of the job's CA key: the node count and the rendezvous host, which every node of the
/// job is given and a job elsewhere is not. The host is taken as written (lower case, loopback
/// names as one), never resolved: a node's own name may resolve to 127.0.1.1 there and to its
/// address elsewhere. The port is left out: node 0 may be given port 0 and take a free one.
std::string job_salt(int nodes, const std::string& rendezvous_host);

/// The job CA's Ed25519 key from `secret` and `salt` (scrypt with `cost`), as its raw 32-byte
/// public key; for tests and the benchmark. Empty if OpenSSL refused (e.g. `max_memory` below
/// what `cost` needs).
std::string derive_ca_public_key(const std::string& secret, const std::string& salt,
                                 scrypt_cost cost = kScryptCost, uint64_t max_memory = 0);

}  // namespace zmuon
