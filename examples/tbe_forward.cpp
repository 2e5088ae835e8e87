// Pooled lookups into two tables of different widths with three features (two share a table).
#include <cstdio>
#include <memory>
#include <vector>

#include "embscale/memory.h"
#include "embscale/tbe.h"

int main() {
  using namespace embscale;
  const Context ctx = backend_available(Backend::kCuda) ? Context::cuda() : Context::cpu();

  TbeConfig cfg;
  cfg.tables = {{/*num_rows=*/1000, /*dim=*/4}, {/*num_rows=*/50, /*dim=*/3}};
  cfg.feature_table_map = {0, 1, 0};  // features 0 and 2 look up table 0
  cfg.weights_dtype = DType::kF32;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  Status st = TableBatchedEmbedding::create(ctx, cfg, &tbe);
  if (!st.ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;

  // Row r of every table holds the value r in each column, so a pooled sum is the sum of the indices.
  std::vector<float> w(tbe->num_weights());
  for (int t = 0; t < tbe->num_tables(); ++t)
    for (int64_t r = 0; r < cfg.tables[t].num_rows; ++r)
      for (int d = 0; d < cfg.tables[t].dim; ++d) w[tbe->weight_offset(t) + r * cfg.tables[t].dim + d] = float(r);

  const int64_t B = 2;                                   // batch of two samples
  std::vector<int64_t> indices = {1, 2, 3, 7, 10, 20, 30, 999};
  std::vector<int64_t> offsets = {0, 2, 3, 4, 6, 8, 8};  // [T*B+1], table-major; bag (2, 1) is empty

  Buffer dw(ctx.backend, w.size() * 4), di(ctx.backend, indices.size() * 8), doff(ctx.backend, offsets.size() * 8);
  Buffer dout(ctx.backend, B * tbe->total_dim() * 4);
  st = copy_to_backend(ctx, dw.data(), w.data(), w.size() * 4);
  if (st.ok()) st = copy_to_backend(ctx, di.data(), indices.data(), indices.size() * 8);
  if (st.ok()) st = copy_to_backend(ctx, doff.data(), offsets.data(), offsets.size() * 8);

  TbeForwardArgs args;
  args.weights = TensorView::vec(dw.data(), DType::kF32, tbe->num_weights());
  args.indices = TensorView::vec(di.data(), DType::kI64, indices.size());
  args.offsets = TensorView::vec(doff.data(), DType::kI64, offsets.size());
  args.batch_size = B;
  args.pooling = PoolingMode::kSum;
  args.output = TensorView::mat(dout.data(), DType::kF32, B, tbe->total_dim());  // [B, 4 + 3 + 4]
  if (st.ok()) st = tbe->forward(ctx, args);
  std::vector<float> out(B * tbe->total_dim());
  if (st.ok()) st = copy_to_host(ctx, out.data(), dout.data(), out.size() * 4);
  if (!st.ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
  for (int64_t b = 0; b < B; ++b) {
    std::printf("sample %lld:", static_cast<long long>(b));
    for (int c = 0; c < tbe->total_dim(); ++c) std::printf(" %g", out[b * tbe->total_dim() + c]);
    std::printf("\n");
  }
  // An index outside its table is reported with feature, bag and position; the tables are untouched.
  indices[5] = 50;
  st = copy_to_backend(ctx, di.data(), indices.data(), indices.size() * 8);
  if (st.ok()) st = tbe->forward(ctx, args);
  std::printf("bad index: %s\n", st.to_string().c_str());
  const bool sums_ok = out[0] == 3.0f && out[4] == 7.0f && out[7] == 1029.0f && out[11 + 4] == 30.0f && out[11 + 7] == 0.0f;
  return (sums_ok && st.code() == StatusCode::kOutOfRange) ? 0 : 1;
}
