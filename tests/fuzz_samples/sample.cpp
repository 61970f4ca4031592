#include <map>
#include <string>
#include <vector>

namespace shapes {

template <typename T>
class Grid {
 public:
  explicit Grid(std::size_t n) : cells_(n * n) {}
  T& at(std::size_t row, std::size_t col) { return cells_[row * side() + col]; }
  std::size_t side() const { return static_cast<std::size_t>(cells_.size()); }

 private:
  std::vector<T> cells_;
};

}  // namespace shapes

int main() {
  auto raw = R"json({"open": [1, 2)json";
  std::map<std::string, int> counts{{"a", 1}, {"b", 2}};
  shapes::Grid<int> grid(3);
  grid.at(1, 2) = counts["a"] + static_cast<int>(raw[0]);
  return [](int x) { return x > 0 ? 0 : 1; }(grid.at(1, 2));
}
