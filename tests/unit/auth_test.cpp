#include <gtest/gtest.h>

#include "common/auth.hpp"
#include "common/error.hpp"

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
