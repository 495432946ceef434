#include "hdf5io/formats/image_folder_listing.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <system_error>
#include <thread>
#include <utility>

#include "common/first_error.h"
#include "hdf5io/io/read_file.h"

namespace gpufeed::image_folder {

// ---------------------------------------------------------------------------
// Listing the folder. readdir's d_type says what an entry is, so the one
// call a file needs is an fstatat beside its directory's descriptor (its
// size). On a cold cache each of those waits for the disk to read the
// file's inode: one at a time, 100,000 files took 12 to 26 s on the
// developer machine; many in flight (kListThreads threads, each blocked on
// the disk, not on a core), a few seconds (docs/benchmarks.md, "Image
// folders on the developer machine (issue 48)").

namespace {

// Calls in flight while listing: threads that wait on the disk, not cores.
constexpr size_t kListThreads = 32;
// Files stat'ed by one task (one open of their directory).
constexpr size_t kStatBatch = 256;

bool IsImageName(const char* name) {
  const char* dot = std::strrchr(name, '.');
  if (dot == nullptr) return false;
  return strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0 || strcasecmp(dot, ".png") == 0;
}

// Hidden entries are skipped: macOS leaves "._name.jpg" AppleDouble files and
// tools leave ".ipynb_checkpoints" folders; neither is a sample or a class.
bool IsHidden(const char* name) { return name[0] == '.'; }

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};
using DirHandle = std::unique_ptr<DIR, DirCloser>;

Status CannotList(const std::string& path, int err) {
  return Status::IOError(path + ": cannot list: " + std::strerror(err));
}
Status CannotStat(const std::string& path, const char* name, int err) {
  return Status::IOError(path + "/" + name + ": cannot stat: " + std::strerror(err));
}

// Runs task(i) for every i in [0, n) on up to kListThreads threads (fewer
// where the system gives fewer); stops taking tasks once `errors` holds one.
void RunInFlight(size_t n, FirstError* errors, const std::function<Status(size_t)>& task) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    try {
      for (size_t i; !errors->failed() && (i = next.fetch_add(1)) < n;) errors->Set(task(i));
    } catch (const std::exception& e) {  // a thread root: an allocation that failed, said
      errors->Set(Status::Internal(std::string("listing an image folder: ") + e.what()));
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < std::min(n, kListThreads); ++t) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads: the ones started (and this one) do the rest
    }
  }
  work();
  for (std::thread& t : threads) t.join();
}

// One directory of a class (the class folder or one below it) and its image
// files: names, then their sizes and whether each is a symbolic link.
struct DirFiles {
  std::string path;  // as walked: the class folder's path, then the names below it
  std::string rel;   // under the class folder ("" for the class folder)
  size_t label = 0;
  std::vector<std::string> names;
  std::vector<uint64_t> sizes;
  std::vector<char> stated;  // the size is known (a link or an entry of unknown kind, stat'ed while listing)
  std::vector<char> links;
};

// Lists a class folder and the folders below it (images there belong to the
// class too, as torchvision's ImageFolder walks them; symbolic links
// followed; hidden entries skipped), stat'ing only links and entries whose
// kind readdir does not say. `ancestors_` are the (device, inode) of the
// folders above the one listed, from the image folder's own ancestors
// (`above`) on: a link back to one of them is a loop, said.
class ClassWalk {
 public:
  using Ancestors = std::vector<std::pair<dev_t, ino_t>>;
  ClassWalk(std::string class_dir, size_t label, std::vector<DirFiles>* out, Ancestors above,
            const EnterCheck& may_enter)
      : class_dir_(std::move(class_dir)),
        label_(label),
        out_(out),
        ancestors_(std::move(above)),
        may_enter_(may_enter) {}

  // `checked`: a plain subdirectory of a folder already walked, which lies
  // where its parent does; anything else is asked of may_enter_ first.
  Status Walk(const std::string& rel, bool checked = false) {
    const std::string path = rel.empty() ? class_dir_ : class_dir_ + "/" + rel;
    if (!checked && may_enter_) GPUFEED_RETURN_IF_ERROR(may_enter_(path));
    DirHandle d(::opendir(path.c_str()));
    if (d == nullptr) return CannotList(path, errno);
    const int fd = ::dirfd(d.get());
    struct stat self {};
    if (::fstat(fd, &self) != 0) return CannotList(path, errno);
    for (const auto& [dev, ino] : ancestors_) {
      if (dev == self.st_dev && ino == self.st_ino) {
        return Status::InvalidArgument(path + ": a symbolic link back to a folder above it (a loop); remove the link");
      }
    }
    DirFiles files{path, rel, label_, {}, {}, {}, {}};
    std::vector<std::pair<std::string, bool>> subdirs;  // (path under the class, a plain subdirectory)
    errno = 0;
    for (struct dirent* e; (e = ::readdir(d.get())) != nullptr; errno = 0) {
      if (IsHidden(e->d_name)) continue;  // ".", ".." too
      const bool image = IsImageName(e->d_name);
      if (e->d_type == DT_DIR) {
        subdirs.emplace_back(rel.empty() ? std::string(e->d_name) : rel + "/" + e->d_name, true);
        continue;
      }
      if (e->d_type == DT_REG) {
        if (image) AddFile(&files, e->d_name, 0, false, false);
        continue;
      }
      // A link, or a kind the file system does not say: followed.
      struct stat st {
      }, lst{};
      if (::fstatat(fd, e->d_name, &st, 0) != 0) {
        if (errno == ENOENT || errno == ELOOP) continue;  // a dangling link (or a loop of links): no file
        return CannotStat(path, e->d_name, errno);
      }
      if (S_ISDIR(st.st_mode)) {
        subdirs.emplace_back(rel.empty() ? std::string(e->d_name) : rel + "/" + e->d_name, false);
      } else if (image && S_ISREG(st.st_mode)) {
        bool link = e->d_type == DT_LNK;
        if (e->d_type == DT_UNKNOWN) {
          if (::fstatat(fd, e->d_name, &lst, AT_SYMLINK_NOFOLLOW) != 0) return CannotStat(path, e->d_name, errno);
          link = S_ISLNK(lst.st_mode);
        }
        AddFile(&files, e->d_name, static_cast<uint64_t>(st.st_size), true, link);
      }
    }
    if (errno != 0) return CannotList(path, errno);
    d.reset();
    if (!files.names.empty()) out_->push_back(std::move(files));
    ancestors_.emplace_back(self.st_dev, self.st_ino);
    for (const auto& [sub, plain] : subdirs) GPUFEED_RETURN_IF_ERROR(Walk(sub, plain));
    ancestors_.pop_back();
    return Status::Ok();
  }

 private:
  static void AddFile(DirFiles* f, const char* name, uint64_t size, bool stated, bool link) {
    f->names.emplace_back(name);
    f->sizes.push_back(size);
    f->stated.push_back(stated ? 1 : 0);
    f->links.push_back(link ? 1 : 0);
  }

  std::string class_dir_;
  size_t label_;
  std::vector<DirFiles>* out_;
  Ancestors ancestors_;
  const EnterCheck& may_enter_;
};

// The image folder `root` and every folder above it, to "/": a link in a
// class to one of them is a loop too, said where the link is (not after
// walking the other classes, or the whole file system, down to it again).
ClassWalk::Ancestors FoldersAbove(const std::string& root) {
  ClassWalk::Ancestors out;
  std::string p = root;  // ends with '/'
  for (int depth = 0; depth < 256; ++depth, p += "../") {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) break;
    if (!out.empty() && out.back() == std::make_pair(st.st_dev, st.st_ino)) break;  // "/" is its own parent
    out.emplace_back(st.st_dev, st.st_ino);
  }
  return out;
}

// The class folders of `dir` (hidden ones skipped; links to folders taken),
// sorted: a class's label is its index.
Status ListClasses(const std::string& dir, std::vector<std::string>* names) {
  DirHandle d(::opendir(dir.c_str()));
  if (d == nullptr) return CannotList(dir, errno);
  errno = 0;
  for (struct dirent* e; (e = ::readdir(d.get())) != nullptr; errno = 0) {
    if (IsHidden(e->d_name)) continue;
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type != DT_DIR && e->d_type != DT_REG) {
      struct stat st {};
      is_dir = ::fstatat(::dirfd(d.get()), e->d_name, &st, 0) == 0 && S_ISDIR(st.st_mode);
    }
    if (is_dir) names->push_back(e->d_name);
  }
  if (errno != 0) return CannotList(dir, errno);
  std::sort(names->begin(), names->end());
  return Status::Ok();
}

// Sizes of the files of dirs[d] from `begin` to `end` not known yet: one
// open of the directory, an fstatat a file.
Status StatFiles(DirFiles* dir, size_t begin, size_t end) {
  const int fd = ::open(dir->path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return CannotList(dir->path, errno);
  Status status;
  for (size_t i = begin; i < end && status.ok(); ++i) {
    if (dir->stated[i]) continue;
    struct stat st {};
    if (::fstatat(fd, dir->names[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      status = CannotStat(dir->path, dir->names[i].c_str(), errno);
    } else if (!S_ISREG(st.st_mode)) {
      status = Status::IOError(dir->path + "/" + dir->names[i] +
                               ": no longer a regular file (the folder changed while it was listed); open it again");
    }
    dir->sizes[i] = static_cast<uint64_t>(st.st_size);
  }
  ::close(fd);
  return status;
}

// Every class's files, listed (a class a task), then their sizes taken
// (kStatBatch files a task), all with many calls in flight.
Result<std::vector<DirFiles>> ListFiles(const std::string& root, const std::vector<std::string>& class_names,
                                        const EnterCheck& may_enter) {
  std::vector<std::vector<DirFiles>> per_class(class_names.size());
  FirstError errors;
  const ClassWalk::Ancestors above = FoldersAbove(root);
  RunInFlight(class_names.size(), &errors, [&](size_t label) {
    ClassWalk walk(root + class_names[label], label, &per_class[label], above, may_enter);
    return walk.Walk("");
  });
  GPUFEED_RETURN_IF_ERROR(errors.Get());
  std::vector<DirFiles> dirs;
  for (auto& c : per_class) std::move(c.begin(), c.end(), std::back_inserter(dirs));
  struct Batch {
    size_t dir, begin, end;
  };
  std::vector<Batch> batches;
  for (size_t d = 0; d < dirs.size(); ++d) {
    for (size_t b = 0; b < dirs[d].names.size(); b += kStatBatch) {
      batches.push_back({d, b, std::min(dirs[d].names.size(), b + kStatBatch)});
    }
  }
  RunInFlight(batches.size(), &errors,
              [&](size_t i) { return StatFiles(&dirs[batches[i].dir], batches[i].begin, batches[i].end); });
  GPUFEED_RETURN_IF_ERROR(errors.Get());
  return dirs;
}

// A listed file: where it is under its class folder (`rel`/`name`, or
// `name` where rel is empty), its size, whether it is a symbolic link.
struct ListedFile {
  const std::string* rel;
  const std::string* name;
  uint64_t size;
  bool link;
};

// a's path under the class folder before b's, as strings compare (bytes as
// unsigned), without joining them: 1.28 M files would make as many strings.
bool JoinedLess(const ListedFile& a, const ListedFile& b) {
  if (a.rel == b.rel) return *a.name < *b.name;         // one directory: the common case
  auto at = [](const ListedFile& f, size_t i) -> int {  // byte i of the joined path; -1 past its end
    const std::string& r = *f.rel;
    if (!r.empty()) {
      if (i < r.size()) return static_cast<unsigned char>(r[i]);
      if (i == r.size()) return '/';
      i -= r.size() + 1;
    }
    return i < f.name->size() ? static_cast<unsigned char>((*f.name)[i]) : -1;
  };
  for (size_t i = 0;; ++i) {
    const int x = at(a, i), y = at(b, i);
    if (x != y) return x < y;
    if (x < 0) return false;
  }
}

}  // namespace

Result<FolderListing> ListImageFolder(const std::string& dir, const EnterCheck& may_enter) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return Status::NotFound(dir + ": no such directory (" + std::strerror(errno) + ")");
    }
    return Status::IOError(dir + ": cannot stat: " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument(dir + ": not a directory (an image folder holds one subfolder per class)");
  }
  FolderListing out;
  GPUFEED_RETURN_IF_ERROR(ListClasses(dir, &out.class_names));
  if (out.class_names.empty()) {
    return Status::InvalidArgument(dir + ": no class subfolders (expected " + dir + "/<class>/<image>.jpg)");
  }
  const std::string root = dir.back() == '/' ? dir : dir + "/";
  auto dirs = ListFiles(root, out.class_names, may_enter);
  if (!dirs.ok()) return dirs.status();
  // Class by class (dirs are in class order), sorted by the path under the
  // class folder.
  std::vector<ListedFile> files;
  for (size_t d = 0; d < dirs->size();) {
    const size_t label = (*dirs)[d].label;
    const std::string class_dir = root + out.class_names[label];
    files.clear();
    for (; d < dirs->size() && (*dirs)[d].label == label; ++d) {
      const DirFiles& f = (*dirs)[d];
      out.image_dirs.push_back(f.path);
      for (size_t i = 0; i < f.names.size(); ++i) files.push_back({&f.rel, &f.names[i], f.sizes[i], f.links[i] != 0});
    }
    std::sort(files.begin(), files.end(), JoinedLess);
    for (const ListedFile& f : files) {
      if (f.link) out.linked_files.push_back(out.files.size());
      std::string path;
      path.reserve(class_dir.size() + f.rel->size() + f.name->size() + 2);
      path.append(class_dir).append("/");
      if (!f.rel->empty()) path.append(*f.rel).append("/");
      out.files.push_back(std::move(path.append(*f.name)));
      out.labels.push_back(static_cast<int64_t>(label));
      out.sizes.push_back(f.size);
      out.total_bytes += f.size;
    }
  }
  if (out.files.empty()) {
    return Status::InvalidArgument(dir + ": no .jpg, .jpeg or .png files in its " +
                                   std::to_string(out.class_names.size()) + " class subfolders");
  }
  return out;
}

// Reads a whole file into `out` (resized to fit), through io (read_file.h).
Status ReadWholeFile(const std::string& path, std::vector<unsigned char>* out) { return io::ReadWholeFile(path, out); }

}  // namespace gpufeed::image_folder
