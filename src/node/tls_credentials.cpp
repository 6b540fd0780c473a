#include "node/tls_credentials.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <set>

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include "base/log.hpp"
#include "base/private_files.hpp"

namespace zmuon {

namespace {

// RAII owners of the OpenSSL objects used here.
struct pkey_free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct x509_free {
  void operator()(X509* p) const { X509_free(p); }
};
struct bio_free {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct pctx_free {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_free>;
using x509_ptr = std::unique_ptr<X509, x509_free>;
using bio_ptr = std::unique_ptr<BIO, bio_free>;
using pctx_ptr = std::unique_ptr<EVP_PKEY_CTX, pctx_free>;

error tls_error(const std::string& what) {
  return {errc::internal, "cannot make the job's TLS credentials: " + what};
}

struct kdf_free {
  void operator()(EVP_KDF* p) const { EVP_KDF_free(p); }
};
struct kdf_ctx_free {
  void operator()(EVP_KDF_CTX* p) const { EVP_KDF_CTX_free(p); }
};

// The CA's Ed25519 key, the same on every node of the job: scrypt of the secret and the job's
// salt. Memory-hard, so that each guess of an attacker holding a certificate costs as much.
pkey_ptr ca_key_from(const std::string& secret, const std::string& salt, scrypt_cost cost,
                     uint64_t max_memory) {
  std::unique_ptr<EVP_KDF, kdf_free> kdf(EVP_KDF_fetch(nullptr, "SCRYPT", nullptr));
  std::unique_ptr<EVP_KDF_CTX, kdf_ctx_free> ctx(kdf ? EVP_KDF_CTX_new(kdf.get()) : nullptr);
  if (!ctx)
    return nullptr;
  static const std::string label = "zmuon job CA ed25519 v2\n";
  std::string salted = label + salt;
  // Room for the work factor (128 * r * N and a little) unless the caller sets a cap.
  uint64_t most = max_memory != 0 ? max_memory : 2 * cost.memory();
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_PASSWORD, const_cast<char*>(secret.data()),
                                        secret.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salted.data(), salted.size()),
      OSSL_PARAM_construct_uint64(OSSL_KDF_PARAM_SCRYPT_N, &cost.n),
      OSSL_PARAM_construct_uint32(OSSL_KDF_PARAM_SCRYPT_R, &cost.r),
      OSSL_PARAM_construct_uint32(OSSL_KDF_PARAM_SCRYPT_P, &cost.p),
      OSSL_PARAM_construct_uint64(OSSL_KDF_PARAM_SCRYPT_MAXMEM, &most),
      OSSL_PARAM_construct_end()};
  unsigned char seed[32];
  if (EVP_KDF_derive(ctx.get(), seed, sizeof seed, params) <= 0)
    return nullptr;
  pkey_ptr key(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed, sizeof seed));
  OPENSSL_cleanse(seed, sizeof seed);
  return key;
}

pkey_ptr fresh_key() {
  pctx_ptr ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr));
  EVP_PKEY* key = nullptr;
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) <= 0 || EVP_PKEY_keygen(ctx.get(), &key) <= 0)
    return nullptr;
  return pkey_ptr(key);
}

bool add_ext(X509* cert, X509V3_CTX* ctx, int nid, const char* value) {
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, ctx, nid, value);
  if (ext == nullptr)
    return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `key`, valid from now + `from_s` to now + `to_s`, signed by `issuer_key`
// (self-signed, a CA, when `issuer` is null).
x509_ptr make_cert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key,
                   long from_s, long to_s) {
  x509_ptr cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1)
    return nullptr;
  BIGNUM* serial = BN_new();
  const bool serial_ok =
      serial != nullptr && BN_rand(serial, 120, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1
      && BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(serial);
  if (!serial_ok)
    return nullptr;
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), from_s);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), to_s);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  if (X509_set_pubkey(cert.get(), key) != 1)
    return nullptr;
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer ? issuer : cert.get(), cert.get(), nullptr, nullptr, 0);
  const bool ca = issuer == nullptr;
  bool ok = add_ext(cert.get(), &ctx, NID_subject_key_identifier, "hash");
  if (ca)
    ok = ok && add_ext(cert.get(), &ctx, NID_basic_constraints, "critical,CA:TRUE")
         && add_ext(cert.get(), &ctx, NID_key_usage, "critical,keyCertSign,cRLSign");
  else
    ok = ok && add_ext(cert.get(), &ctx, NID_basic_constraints, "critical,CA:FALSE")
         && add_ext(cert.get(), &ctx, NID_key_usage, "critical,digitalSignature")
         && add_ext(cert.get(), &ctx, NID_ext_key_usage, "serverAuth,clientAuth")
         && add_ext(cert.get(), &ctx, NID_authority_key_identifier, "keyid:always");
  if (!ok || X509_sign(cert.get(), issuer_key, nullptr) <= 0)  // Ed25519: no digest
    return nullptr;
  return cert;
}

std::string pem_of(X509* cert) {
  bio_ptr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1)
    return {};
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string pem_of(EVP_PKEY* key) {
  bio_ptr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    return {};
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// The first line of `text`, without its line end.
std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  if (!line.empty() && line.back() == '\r')
    line.pop_back();
  return line;
}

expected<std::string> secret_from_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
    return error{errc::invalid_argument,
                 "the job's secret file '" + path + "' may be read by others (chmod 600 it)"};
  auto text = read_regular_file(path, 4096, "the job's secret file '" + path + "'");
  if (!text)
    return text.err();
  return first_line(*text);
}

constexpr long kDay = 24 * 3600;

// The characters of `secret` that continue a repeat or a run: a fourth character with the same
// step from the one before as the two steps before it ("aaaa", "abcd", "aceg"), or one that
// repeats the character `period` back for the fourth time in a row ("abcabcabc").
size_t predictable_characters(const std::string& secret) {
  const auto at = [&](size_t i) { return static_cast<int>(static_cast<unsigned char>(secret[i])); };
  size_t predictable = 0;
  for (size_t i = 3; i < secret.size(); ++i) {
    const int step = at(i) - at(i - 1);
    bool run = step == at(i - 1) - at(i - 2) && step == at(i - 2) - at(i - 3);
    for (size_t period = 2; !run && period <= 8 && i >= period + 3; ++period) {
      run = true;
      for (size_t k = 0; k < 4 && run; ++k)
        run = secret[i - k] == secret[i - k - period];
    }
    predictable += run ? 1 : 0;
  }
  return predictable;
}

// log2 of the alphabet estimated_secret_bits assumes.
double alphabet_bits(const std::string& secret) {
  bool lower = false, upper = false, digit = false, symbol = false, other = false;
  bool hex = !secret.empty();
  std::set<unsigned char> distinct;
  for (unsigned char c : secret) {
    distinct.insert(c);
    lower |= std::islower(c) != 0 && c < 128;
    upper |= std::isupper(c) != 0 && c < 128;
    digit |= std::isdigit(c) != 0;
    symbol |= c < 128 && std::isalnum(c) == 0;
    other |= c >= 128;
    hex &= std::isxdigit(c) != 0;
  }
  // Hex digits of one case are an alphabet of 16.
  double classes = hex && !(lower && upper)
                       ? 16.0
                       : 26.0 * lower + 26.0 * upper + 10.0 * digit + 33.0 * symbol + 128.0 * other;
  return std::log2(std::max(1.0, std::min(classes, 2.0 * static_cast<double>(distinct.size()))));
}

}  // namespace

double estimated_secret_bits(const std::string& secret) {
  const double length = static_cast<double>(secret.size() - predictable_characters(secret));
  return length * alphabet_bits(secret);
}

error check_job_secret(const std::string& secret, const std::string& from, bool weak_ok) {
  if (secret.size() < kMinSecretBytes)
    return error{errc::invalid_argument, "the job's secret in " + from + " is shorter than "
                                             + std::to_string(kMinSecretBytes) + " bytes"};
  const double bits = estimated_secret_bits(secret);
  if (bits >= kMinSecretBits)
    return {};
  // The problems, named: repeats and runs, a short alphabet, a short secret.
  std::string why;
  const size_t predictable = predictable_characters(secret);
  if (predictable > 0)
    why += std::to_string(predictable) + " of its characters continue a repeat or a run; ";
  const double alphabet = std::exp2(alphabet_bits(secret));
  if (alphabet < 64)
    why += "its alphabet is about " + std::to_string(static_cast<int>(std::lround(alphabet)))
           + " characters; ";
  why += "it is " + std::to_string(secret.size()) + " characters long";
  const std::string estimate = "about " + std::to_string(static_cast<int>(bits)) + " bits, "
                               + std::to_string(static_cast<int>(kMinSecretBits)) + " needed";
  if (weak_ok) {
    ZMUON_LOG_WARN("the job's secret in " + from + " is easy to guess (" + estimate
                   + "), allowed by --weak-secret-ok");
    return {};
  }
  return error{errc::invalid_argument,
               "the job's secret in " + from + " is too easy to guess (" + estimate + ": " + why
                   + "): make one with 'zmuon-launch --new-secret FILE' and give every node "
                     "--secret-file FILE, or allow this one with --weak-secret-ok "
                     "($ZMUON_WEAK_SECRET_OK=1)"};
}

std::string job_salt(int nodes, const std::string& rendezvous_host) {
  std::string host = rendezvous_host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  std::transform(host.begin(), host.end(), host.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0)
    host = "loopback";
  return "nodes " + std::to_string(nodes) + "\nrendezvous host " + host + "\n";
}

std::string derive_ca_public_key(const std::string& secret, const std::string& salt,
                                 scrypt_cost cost, uint64_t max_memory) {
  pkey_ptr key = ca_key_from(secret, salt, cost, max_memory);
  unsigned char raw[32];
  size_t len = sizeof raw;
  if (!key || EVP_PKEY_get_raw_public_key(key.get(), raw, &len) != 1)
    return {};
  return std::string(reinterpret_cast<const char*>(raw), len);
}

expected<std::unique_ptr<tls_credentials>> tls_credentials::make(const std::string& secret,
                                                                 const std::string& salt,
                                                                 int64_t join_timeout_ms,
                                                                 test_certificate kind) {
  if (secret.size() < kMinSecretBytes)
    return error{errc::invalid_argument,
                 "the job's secret is shorter than " + std::to_string(kMinSecretBytes) + " bytes"};
  pkey_ptr ca_key = ca_key_from(secret, salt, kScryptCost, 0);
  // A foreign CA (tests): the same secret without the job's salt.
  pkey_ptr foreign = kind == test_certificate::foreign_ca
                         ? ca_key_from(secret, "another job", kScryptCost, 0)
                         : nullptr;
  EVP_PKEY* signer = foreign ? foreign.get() : ca_key.get();
  pkey_ptr key = fresh_key();
  if (!ca_key || !signer || !key)
    return tls_error("no Ed25519 key (scrypt or key generation failed)");
  // Every connection of the job opens during the join: the certificates end with its deadline
  // (and a margin for clocks apart), so that a node's key is worth nothing after it. They begin a
  // day back, for clocks behind.
  const long life = static_cast<long>(std::min<int64_t>(join_timeout_ms / 1000, 3650 * kDay))
                    + kCertificateMarginSeconds;
  // Every node makes the same CA (name and key).
  x509_ptr ca = make_cert(ca_key.get(), "zmuon job CA", nullptr, ca_key.get(), -kDay, life);
  x509_ptr signer_ca = make_cert(signer, "zmuon job CA", nullptr, signer, -kDay, life);
  if (!ca || !signer_ca)
    return tls_error("no CA certificate");
  const long from = kind == test_certificate::expired ? -2 * kDay : -kDay;
  const long to = kind == test_certificate::expired ? -kDay : life;
  x509_ptr cert = make_cert(key.get(), "zmuon node", signer_ca.get(), signer, from, to);
  if (!cert)
    return tls_error("no node certificate");

  // In memory only: no key file that a signal could leave behind (the TLS context reads these).
  std::unique_ptr<tls_credentials> out(new tls_credentials());
  out->ca_pem_ = pem_of(ca.get());
  out->cert_pem_ = pem_of(cert.get());
  out->key_pem_ = pem_of(key.get());
  if (out->ca_pem_.empty() || out->cert_pem_.empty() || out->key_pem_.empty())
    return tls_error("cannot write PEM");
  return out;
}

tls_credentials::~tls_credentials() {
  if (!key_pem_.empty())
    OPENSSL_cleanse(&key_pem_[0], key_pem_.size());
}

std::string random_secret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1)
    return {};
  static const char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  OPENSSL_cleanse(bytes, sizeof bytes);
  return out;
}

error write_new_secret(const std::string& path) {
  std::string secret = random_secret();
  if (secret.empty())
    return error{errc::internal, "no randomness for a new secret"};
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0)
    return error{errc::invalid_argument,
                 "'" + path + "' exists already: a secret file is never overwritten"};
  auto err = write_new_file(path, secret + "\n", 0600);
  OPENSSL_cleanse(secret.data(), secret.size());
  return err;
}

std::string job_secret_source(const std::string& secret_file) {
  if (!secret_file.empty())
    return "the file '" + secret_file + "'";
  if (const char* env = std::getenv("ZMUON_JOB_SECRET"); env != nullptr && *env != '\0')
    return "$ZMUON_JOB_SECRET";
  if (const char* file = std::getenv("ZMUON_JOB_SECRET_FILE"); file != nullptr && *file != '\0')
    return "the file '" + std::string(file) + "' ($ZMUON_JOB_SECRET_FILE)";
  return "the node's options";
}

expected<std::string> read_job_secret(const std::string& secret_file) {
  std::string secret;
  std::string from;
  if (!secret_file.empty()) {
    auto s = secret_from_file(secret_file);
    if (!s)
      return s.err();
    secret = *s;
    from = "the file '" + secret_file + "'";
  } else if (const char* env = std::getenv("ZMUON_JOB_SECRET"); env != nullptr && *env != '\0') {
    secret = env;
    from = "$ZMUON_JOB_SECRET";
  } else if (const char* file = std::getenv("ZMUON_JOB_SECRET_FILE");
             file != nullptr && *file != '\0') {
    auto s = secret_from_file(file);
    if (!s)
      return s.err();
    secret = *s;
    from = "the file '" + std::string(file) + "' ($ZMUON_JOB_SECRET_FILE)";
  } else {
    return std::string();
  }
  if (secret.size() < kMinSecretBytes)
    return error{errc::invalid_argument, "the job's secret in " + from + " is shorter than "
                                             + std::to_string(kMinSecretBytes) + " bytes"};
  return secret;
}

}  // namespace zmuon
