#include "node/tls_credentials.hpp"

#include <cstdlib>
#include <ctime>

#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

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

// The CA's Ed25519 key, the same on every node: HKDF-SHA256 of the secret.
pkey_ptr ca_key_from(const std::string& secret) {
  static const char salt[] = "zmuon job CA";
  static const char info[] = "ed25519 seed v1";
  unsigned char seed[32];
  size_t len = sizeof seed;
  pctx_ptr ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) <= 0
      || EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) <= 0
      || EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), reinterpret_cast<const unsigned char*>(salt),
                                     sizeof salt - 1)
             <= 0
      || EVP_PKEY_CTX_set1_hkdf_key(ctx.get(),
                                    reinterpret_cast<const unsigned char*>(secret.data()),
                                    static_cast<int>(secret.size()))
             <= 0
      || EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), reinterpret_cast<const unsigned char*>(info),
                                     sizeof info - 1)
             <= 0
      || EVP_PKEY_derive(ctx.get(), seed, &len) <= 0)
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

}  // namespace

expected<std::unique_ptr<tls_credentials>> tls_credentials::make(const std::string& secret,
                                                                 test_certificate kind) {
  if (secret.size() < kMinSecretBytes)
    return error{errc::invalid_argument,
                 "the job's secret is shorter than " + std::to_string(kMinSecretBytes) + " bytes"};
  pkey_ptr ca_key = ca_key_from(secret);
  pkey_ptr signer = kind == test_certificate::foreign_ca ? ca_key_from(secret + " (another job)")
                                                         : ca_key_from(secret);
  pkey_ptr key = fresh_key();
  if (!ca_key || !signer || !key)
    return tls_error("no Ed25519 key");
  // Every node makes the same CA (name and key); the validity spans any clock skew.
  x509_ptr ca = make_cert(ca_key.get(), "zmuon job CA", nullptr, ca_key.get(), -kDay, 3650 * kDay);
  x509_ptr signer_ca =
      make_cert(signer.get(), "zmuon job CA", nullptr, signer.get(), -kDay, 3650 * kDay);
  if (!ca || !signer_ca)
    return tls_error("no CA certificate");
  const long from = kind == test_certificate::expired ? -2 * kDay : -kDay;
  const long to = kind == test_certificate::expired ? -kDay : 30 * kDay;
  x509_ptr cert = make_cert(key.get(), "zmuon node", signer_ca.get(), signer.get(), from, to);
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
