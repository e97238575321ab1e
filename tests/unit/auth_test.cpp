#include <gtest/gtest.h>

#include "common/auth.hpp"
#include "common/error.hpp"
#include "common/hmac.hpp"

using namespace pe::auth;

TEST(AuthTest, BothSidesProveTheSameSecret) {
  std::string secret = new_secret(), nf = random_bytes(kNonceBytes), nd = random_bytes(kNonceBytes);
  EXPECT_EQ(secret.size(), kSecretBytes);
  std::string sent = daemon_proof(secret, nf, nd, "node3");
  EXPECT_EQ(sent.size(), kProofBytes);
  EXPECT_TRUE(proof_matches(daemon_proof(secret, nf, nd, "node3"), sent));
  EXPECT_TRUE(proof_matches(frontend_proof(secret, nf, nd, "node3"),
                            frontend_proof(secret, nf, nd, "node3")));
}

TEST(AuthTest, WrongSecretReplayTamperingAndReflectionFail) {
  std::string secret = new_secret(), nf = random_bytes(kNonceBytes), nd = random_bytes(kNonceBytes);
  std::string proof = daemon_proof(secret, nf, nd, "node3");
  EXPECT_FALSE(proof_matches(daemon_proof(new_secret(), nf, nd, "node3"), proof));  // stranger
  EXPECT_FALSE(proof_matches(daemon_proof(secret, random_bytes(kNonceBytes), nd, "node3"),
                             proof));                                           // replay
  EXPECT_FALSE(proof_matches(daemon_proof(secret, nf, nd, "node4"), proof));    // node id
  EXPECT_FALSE(proof_matches(frontend_proof(secret, nf, nd, "node3"), proof));  // reflection
  EXPECT_FALSE(proof_matches(proof, proof.substr(0, 31)));
  EXPECT_FALSE(proof_matches(proof, ""));
}

TEST(AuthTest, PartsCannotBeShiftedBetweenFields) {
  std::string secret = new_secret();
  EXPECT_NE(daemon_proof(secret, "ab", "c", "n"), daemon_proof(secret, "a", "bc", "n"));
}

TEST(AuthTest, HexRoundTripAndMalformedSecrets) {
  std::string s = new_secret();
  EXPECT_EQ(to_hex(s).size(), 2 * kSecretBytes);
  EXPECT_EQ(from_hex(to_hex(s)), s);
  EXPECT_EQ(to_hex("\x01\xab"), "01ab");
  EXPECT_THROW(from_hex("abc"), pe::Error);
  EXPECT_THROW(from_hex("zz"), pe::Error);
  EXPECT_NE(new_secret(), new_secret());
}

TEST(AuthTest, RdzvKeyDependsOnSecretAndId) {
  std::string k = rdzv_key("any secret, any length", "job");
  EXPECT_EQ(k.size(), kSecretBytes);
  EXPECT_EQ(k, rdzv_key("any secret, any length", "job"));
  EXPECT_NE(k, rdzv_key("any secret, any length", "job2"));
  EXPECT_NE(k, rdzv_key("another secret", "job"));
  EXPECT_EQ(rdzv_key("", "job").size(), kSecretBytes);  // --rdzv-insecure
}

// The value Python's hmac module gives for the same length-prefixed message
// (hmac.new(b"key", pack("<I", 1) + b"a" + pack("<I", 2) + b"bc", sha256)): libcrypto, loaded at
// the first use, computes HMAC-SHA256 over the parts.
TEST(AuthTest, HmacOverPartsIsHmacSha256OfTheLengthPrefixedMessage) {
  const std::string key = "key", a = "a", bc = "bc";
  EXPECT_EQ(to_hex(pe::crypto::hmac_parts(key, {&a, &bc})),
            "8510ac0378849d37c279468a9d6d0ab1040a47b1fb33c9227fca477a92586607");
  EXPECT_EQ(pe::crypto::hmac_failure(), "HMAC-SHA256 failed");  // libcrypto was found
  EXPECT_TRUE(pe::crypto::equal_constant_time("abc", "abc"));
  EXPECT_FALSE(pe::crypto::equal_constant_time("abc", "abd"));
  EXPECT_FALSE(pe::crypto::equal_constant_time("abc", "ab"));
}
