
set pagination off
set confirm off
python
import gdb, json
out = {}
def vec_ints(addr):
    inf = gdb.selected_inferior()
    b, e = [int.from_bytes(inf.read_memory(addr + 8 * i, 8).tobytes(), 'little') for i in range(2)]
    m = inf.read_memory(b, e - b).tobytes()
    return [int.from_bytes(m[4 * i:4 * i + 4], 'little', signed=True) for i in range((e - b) // 4)]
class BP(gdb.Breakpoint):
    def __init__(self, spec, key, reg):
        super().__init__(spec, internal=True)
        self.key, self.reg = key, reg
    def stop(self):
        if self.key not in out:
            out[self.key] = vec_ints(int(gdb.parse_and_eval(self.reg)))
            with open('docs/results/perf/eval_vs_kvpress_4k_zen4/token_check_kvtrim_ids.json', 'w') as f:
                json.dump(out, f)
        return False
# Session::prefill(const std::vector<int>&): this in rdi, the vector in rsi. Session::generate
# returns a GenerateResult by value: the return slot in rdi, this in rsi, the vector in rdx.
BP('kvtrim::Session::prefill(std::vector<int, std::allocator<int> > const&)', 'context', '$rsi')
BP("kvtrim::Session::generate(std::vector<int, std::allocator<int> > const&, kvtrim::GenerateParams const&, "
   "std::function<bool (int, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > "
   "const&)> const&)", 'question', '$rdx')
end
run
quit
