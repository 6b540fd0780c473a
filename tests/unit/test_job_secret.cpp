// The job's secret and the CA derived from it (docs/SECURITY.md): guessable secrets are refused
// with the problem named, generated ones pass, --new-secret never overwrites, and a certificate
// verifies only against the CA of its job's secret and salt, derived by scrypt, which needs its
// full memory for every guess.
#define BOOST_TEST_MODULE job_secret
#include <boost/test/unit_test.hpp>

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "node/tls_credentials.hpp"

namespace fs = std::filesystem;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The certificate in PEM text (credentials live in memory only).
X509* read_certificate(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  BOOST_REQUIRE(bio != nullptr);
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  BOOST_REQUIRE(cert != nullptr);
  return cert;
}

// The node certificate `pem` verifies against the Ed25519 public key `raw` (32 bytes).
bool verifies_against(const std::string& pem, const std::string& raw) {
  X509* cert = read_certificate(pem);
  EVP_PKEY* key = EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
  BOOST_REQUIRE(key != nullptr);
  const bool ok = X509_verify(cert, key) == 1;
  EVP_PKEY_free(key);
  X509_free(cert);
  return ok;
}

// Seconds from now to the certificate's notAfter.
long seconds_left(const std::string& pem) {
  X509* cert = read_certificate(pem);
  int days = 0, secs = 0;
  BOOST_REQUIRE(ASN1_TIME_diff(&days, &secs, nullptr, X509_get0_notAfter(cert)) == 1);
  X509_free(cert);
  return days * 24L * 3600L + secs;
}

std::string hex_of(std::mt19937_64& gen, int bytes = 32) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    const auto b = static_cast<unsigned>(gen() & 0xff);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(guessable_secrets_are_refused_naming_the_problem) {
  struct weak {
    std::string secret;
    std::string named;  // a part of the message that names the problem
  };
  const std::vector<weak> cases = {
      {std::string(16, 'a'), "continue a repeat or a run"},
      {std::string(20, ' '), "alphabet is about 2 characters"},
      {"llama-70b-run-07", "16 characters long"},
      {"abcdefghijklmnopqrstuvwxyz0123456789", "continue a repeat or a run"},
      {"secret12secret12secret12secret12", "continue a repeat or a run"},
      {"the-job-secret-0123456789", "25 characters long"},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT("'" << c.secret << "' (" << zmuon::estimated_secret_bits(c.secret)
                           << " bits)") {
      auto err = zmuon::check_job_secret(c.secret, "$ZMUON_JOB_SECRET", false);
      BOOST_TEST((err.code() == zmuon::errc::invalid_argument));
      BOOST_TEST(err.message().find("too easy to guess") != std::string::npos, err.message());
      BOOST_TEST(err.message().find(c.named) != std::string::npos, err.message());
      BOOST_TEST(err.message().find("$ZMUON_JOB_SECRET") != std::string::npos, err.message());
      BOOST_TEST(err.message().find("--new-secret") != std::string::npos, err.message());
      // --weak-secret-ok lets it through; the length rule still holds.
      BOOST_TEST(!zmuon::check_job_secret(c.secret, "x", true));
    }
  }
  auto short_one = zmuon::check_job_secret("Xq9#t", "x", true);
  BOOST_TEST(short_one.message().find("shorter than 16 bytes") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(generated_secrets_pass) {
  // 32 random bytes (--new-secret, --local-nodes, the Python process group's) and 16 random
  // bytes as hex (128 bits, the least that should pass), 2,000 each, seeded.
  std::mt19937_64 gen(46);
  for (int i = 0; i < 2000; ++i) {
    const std::string s32 = hex_of(gen), s16 = hex_of(gen, 16);
    BOOST_TEST_REQUIRE(!zmuon::check_job_secret(s32, "x", false), s32);
    BOOST_TEST_REQUIRE(!zmuon::check_job_secret(s16, "x", false), s16);
  }
  BOOST_TEST(!zmuon::check_job_secret(zmuon::random_secret(), "x", false));
  // A random mix of 22 printable characters (about 140 bits).
  BOOST_TEST(!zmuon::check_job_secret("r7#Kp2!vQz9@Lm4$Wx8&Tn", "x", false));
}

// The --new-secret contract: 64 hex digits and a line end, 0600, never over an existing file.
BOOST_AUTO_TEST_CASE(a_new_secret_is_random_private_and_never_overwrites) {
  const std::string path =
      (fs::temp_directory_path() / ("test_job_secret." + std::to_string(::getpid()))).string();
  std::remove(path.c_str());
  BOOST_REQUIRE(!zmuon::write_new_secret(path));
  const std::string text = read_text(path);
  BOOST_TEST(text.size() == 65u);
  BOOST_TEST(text.find_first_not_of("0123456789abcdef") == 64u);
  struct stat st {};
  BOOST_REQUIRE(::stat(path.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0600u);
  auto read = zmuon::read_job_secret(path);
  BOOST_REQUIRE(read);
  BOOST_TEST(*read == text.substr(0, 64));
  BOOST_TEST(!zmuon::check_job_secret(*read, zmuon::job_secret_source(path), false));
  auto again = zmuon::write_new_secret(path);
  BOOST_TEST(again.message().find("exists already") != std::string::npos, again.message());
  BOOST_TEST(read_text(path) == text);
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(the_salt_is_the_jobs_and_spelled_one_way) {
  BOOST_TEST(zmuon::job_salt(2, "127.0.0.1") == zmuon::job_salt(2, "LocalHost"));
  BOOST_TEST(zmuon::job_salt(2, "[::1]") == zmuon::job_salt(2, "127.0.0.1"));
  BOOST_TEST(zmuon::job_salt(2, "Node0.Cluster") == zmuon::job_salt(2, "node0.cluster"));
  BOOST_TEST(zmuon::job_salt(2, "127.0.0.1") != zmuon::job_salt(3, "127.0.0.1"));
  BOOST_TEST(zmuon::job_salt(2, "10.0.0.1") != zmuon::job_salt(2, "10.0.0.2"));
}

// What a stranger holding a node's certificate can do with a dictionary secret: each guess is
// one scrypt derivation with the job's salt, which OpenSSL cannot run in less than 128 * r * N
// bytes, and a table computed for another salt (or none) finds nothing.
BOOST_AUTO_TEST_CASE(a_dictionary_secret_costs_a_full_derivation_per_guess) {
  const std::string secret = "llama-70b-run-07";  // a weak one, as with --weak-secret-ok
  const std::string salt = zmuon::job_salt(2, "node0.example");
  auto creds = zmuon::tls_credentials::make(secret, salt, 60'000);
  BOOST_REQUIRE(creds);
  const std::string cert = (*creds)->cert_pem();

  const auto t0 = std::chrono::steady_clock::now();
  const std::string right = zmuon::derive_ca_public_key(secret, salt);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("one derivation (one guess): "
                     << ms << " ms, " << zmuon::kScryptCost.memory() / (1 << 20) << " MiB");
  BOOST_REQUIRE(right.size() == 32u);
  BOOST_TEST(verifies_against(cert, right));
  // Deterministic: every node of the job derives this CA.
  BOOST_TEST(zmuon::derive_ca_public_key(secret, salt) == right);
  // Another job's salt, no salt, or the secret one character off: no match.
  for (const auto& [s, t] : std::vector<std::pair<std::string, std::string>>{
           {secret, zmuon::job_salt(2, "node1.example")},
           {secret, ""},
           {"llama-70b-run-08", salt}}) {
    const std::string other = zmuon::derive_ca_public_key(s, t);
    BOOST_REQUIRE(other.size() == 32u);
    BOOST_TEST(!verifies_against(cert, other), s << " / " << t);
  }
  // Memory-hard: refused with one byte less than the work factor's memory.
  const auto mem = zmuon::kScryptCost.memory();
  BOOST_TEST(mem >= (uint64_t{32} << 20));
  BOOST_TEST(zmuon::derive_ca_public_key(secret, salt, zmuon::kScryptCost, mem - 1).empty());
  BOOST_TEST(zmuon::derive_ca_public_key(secret, salt, zmuon::kScryptCost, 2 * mem) == right);
}

// The node's certificate ends with the join's deadline and the margin, not weeks later.
BOOST_AUTO_TEST_CASE(the_certificate_lives_for_the_join) {
  const std::string salt = zmuon::job_salt(2, "127.0.0.1");
  for (int64_t timeout_ms : {int64_t{1'500}, int64_t{60'000}, int64_t{3'600'000}}) {
    auto creds = zmuon::tls_credentials::make(zmuon::random_secret(), salt, timeout_ms);
    BOOST_REQUIRE(creds);
    const long left = seconds_left((*creds)->cert_pem());
    const long expected = timeout_ms / 1000 + zmuon::kCertificateMarginSeconds;
    BOOST_TEST_CONTEXT("timeout " << timeout_ms << " ms, " << left << " s left") {
      BOOST_TEST(left <= expected);
      BOOST_TEST(left >= expected - 60);  // the time the test itself took, generously
    }
  }
}
