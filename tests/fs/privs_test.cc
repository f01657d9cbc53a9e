#include "fs/privs.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ckptfs::fs {
namespace {

constexpr uint32_t kFile = S_IFREG;
constexpr uint32_t kGid = 100;

CallerPrivs Unprivileged(uint32_t fsgid = 500) {
  CallerPrivs p;
  p.fsgid = fsgid;
  p.groups = {600};
  return p;
}

CallerPrivs Privileged() {
  CallerPrivs p = Unprivileged();
  p.fsetid = true;
  return p;
}

TEST(PrivsTest, AWriteByAnUnprivilegedCallerClearsWhatMakesAProgramSetId) {
  EXPECT_EQ(SetidClearedByWrite(kFile | 06777, kGid, Unprivileged()), uint32_t{S_ISUID | S_ISGID});
  EXPECT_EQ(SetidClearedByWrite(kFile | 04755, kGid, Unprivileged()), uint32_t{S_ISUID});
  EXPECT_EQ(SetidClearedByWrite(kFile | 0777, kGid, Unprivileged()), 0u);
}

TEST(PrivsTest, SetGroupIdWithoutGroupExecuteStaysForGroupMembersOnly) {
  EXPECT_EQ(SetidClearedByWrite(kFile | 02666, kGid, Unprivileged()), uint32_t{S_ISGID});
  EXPECT_EQ(SetidClearedByWrite(kFile | 02666, kGid, Unprivileged(kGid)), 0u);  // fsgid
  CallerPrivs supplementary = Unprivileged();
  supplementary.groups.push_back(kGid);
  EXPECT_EQ(SetidClearedByWrite(kFile | 02666, kGid, supplementary), 0u);
  // With group execute it is a set-group-ID program: cleared for members too.
  EXPECT_EQ(SetidClearedByWrite(kFile | 02676, kGid, Unprivileged(kGid)), uint32_t{S_ISGID});
}

TEST(PrivsTest, CapFsetidKeepsEverythingOnWrite) {
  EXPECT_EQ(SetidClearedByWrite(kFile | 06777, kGid, Privileged()), 0u);
}

TEST(PrivsTest, OnlyRegularFilesLoseBitsOnWrite) {
  EXPECT_EQ(SetidClearedByWrite(S_IFDIR | 02775, kGid, Unprivileged()), 0u);
}

TEST(PrivsTest, ChownClearsSetUserIdWhoeverCalls) {
  EXPECT_EQ(SetidClearedByChown(kFile | 06755, kGid, Privileged()), uint32_t{S_ISUID | S_ISGID});
  EXPECT_EQ(SetidClearedByChown(kFile | 04700, kGid, Privileged()), uint32_t{S_ISUID});
  // Set-group-ID without group execute: kept by a privileged caller, not by an outsider.
  EXPECT_EQ(SetidClearedByChown(kFile | 02745, kGid, Privileged()), 0u);
  EXPECT_EQ(SetidClearedByChown(kFile | 02745, kGid, Unprivileged()), uint32_t{S_ISGID});
  // A directory's set-group-ID bit is inheritance, not privilege.
  EXPECT_EQ(SetidClearedByChown(S_IFDIR | 02775, kGid, Unprivileged()), 0u);
}

TEST(PrivsTest, CapabilityRemovalsAreTakenOnce) {
  CapsRemovals r;
  r.Note(5, 100);
  EXPECT_FALSE(r.Take(5, 101));  // another caller's
  EXPECT_FALSE(r.Take(6, 100));
  EXPECT_TRUE(r.Take(5, 100));
  EXPECT_FALSE(r.Take(5, 100));
}

TEST(PrivsTest, PrivilegesAreReadFromProc) {
  const CallerPrivs self = PrivsOf(::getpid());
  EXPECT_EQ(self.fsgid, static_cast<uint32_t>(::getegid()));
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  ASSERT_EQ(::syscall(SYS_capget, &hdr, data), 0);
  EXPECT_EQ(self.fsetid, ((data[0].effective >> CAP_FSETID) & 1) != 0);
  // A caller that cannot be read (gone, or a request from the kernel) has no privileges.
  for (pid_t pid : {pid_t{0}, pid_t{-1}, pid_t{999999999}}) {
    const CallerPrivs none = PrivsOf(pid);
    EXPECT_FALSE(none.fsetid);
    EXPECT_FALSE(none.InGroupOrCapable(0));
  }
}

}  // namespace
}  // namespace ckptfs::fs
