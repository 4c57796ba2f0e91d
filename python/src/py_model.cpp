// kvtrim.Model: a GGUF model loaded once (memory-mapped), its tokenizer and chat template, and
// generate(): a prompt, or a context and its questions — the context compressed by the press,
// the questions not (engine/document_qa.h, exactly as `kvtrim run`).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>

#include "core/error.h"
#include "engine/document_qa.h"
#include "engine/session.h"
#include "model/chat_template.h"
#include "ops/matmul.h"
#include "py_common.h"

namespace kvtrim::py {

namespace {

std::vector<ChatMessage> messages_from(const nb::handle& msgs) {
  std::vector<ChatMessage> out;
  for (nb::handle m : msgs) {
    if (!nb::isinstance<nb::dict>(m)) throw nb::type_error("a chat message is a dict with 'role' and 'content'");
    nb::dict d = nb::borrow<nb::dict>(m);
    if (!d.contains("role") || !d.contains("content"))
      throw nb::value_error("a chat message needs 'role' and 'content'");
    out.push_back({nb::cast<std::string>(d["role"]), nb::cast<std::string>(d["content"])});
  }
  return out;
}

std::vector<std::string> questions_from(nb::handle q) {
  if (q.is_none()) return {};
  if (nb::isinstance<nb::str>(q)) return {nb::cast<std::string>(q)};
  std::vector<std::string> out;
  for (nb::handle x : q) out.push_back(nb::cast<std::string>(x));
  if (out.empty()) throw nb::value_error("question: an empty list");
  return out;
}

// prefill_tps as `kvtrim run` reports it: the first answer's prefill covers the context and its
// question, a later one's only its question (the context was prefilled once).
nb::dict answer_dict(const QaAnswer& a, const PromptLayout& layout, size_t qi, const Session& s, double context_s) {
  nb::dict d;
  const GenerateResult& r = a.result;
  d["text"] = r.text;
  d["tokens"] = r.tokens;
  d["stop"] = std::string(stop_reason_name(r.stop));
  d["n_context"] = layout.context.size();
  d["n_question"] = layout.questions[qi].size();
  const double prefill_s = r.prefill_s + (qi == 0 ? context_s : 0);
  const size_t n_prefilled = layout.questions[qi].size() + (qi == 0 ? layout.context.size() : 0);
  d["prefill_s"] = prefill_s;
  d["prefill_tps"] = prefill_s > 0 ? static_cast<double>(n_prefilled) / prefill_s : 0.0;
  d["decode_tps"] = r.decode_tps();
  // the compression's stats when it ran, with whether and why (not)
  nb::dict c = a.compression.ran ? compress_stats_dict(a.compression.stats) : nb::dict();
  c["ran"] = a.compression.ran;
  c["note"] = a.compression.note;
  c["protected"] = layout.protected_what;
  d["compression"] = c;
  d["kv_bytes"] = kv_bytes_dict(s.cache());
  return d;
}

nb::object generate(PyModel& pm, std::optional<std::string> prompt, std::optional<std::string> context,
                    nb::handle question, nb::handle press, int max_tokens, float temperature, int top_k, float top_p,
                    uint64_t seed, bool chat, std::optional<std::string> system, int64_t protect,
                    int64_t press_min_tokens, double press_max_loss, const std::vector<std::string>& stop,
                    std::optional<int64_t> n_ctx, nb::object on_token, bool details) {
  PromptRequest req;
  std::vector<std::string> qs = questions_from(question);
  KVTRIM_CHECK(!(prompt && !qs.empty()), "give prompt or question, not both");
  if (prompt) qs = {*prompt};
  if (qs.empty() && context) qs = {""};  // a context alone: continue it
  KVTRIM_CHECK(!qs.empty(), "give a prompt, or a context and/or a question");
  req.questions = qs;
  req.context = context.value_or("");
  req.chat = chat;
  req.system = system.value_or("");
  req.protect = protect;
  KVTRIM_CHECK(!system || chat, "system needs chat=True");
  KVTRIM_CHECK(protect == 0 || (!chat && !context), "protect is for raw prompts: with a context or chat the question is protected");
  KVTRIM_CHECK(max_tokens >= 0, "max_tokens must be >= 0 (got %d)", max_tokens);
  KVTRIM_CHECK(press_min_tokens >= 0, "press_min_tokens must be >= 0 (got %lld)", static_cast<long long>(press_min_tokens));
  const std::string loss_problem = max_loss_problem(press_max_loss, "press_max_loss");
  KVTRIM_CHECK(loss_problem.empty(), "%s", loss_problem.c_str());
  std::unique_ptr<Press> p = press_from_object(press);
  const PromptLayout layout = layout_prompts(*pm.model, req);

  SessionParams sp = session_params_for(pm, n_ctx, std::nullopt, std::nullopt);
  sp.press_loss = p != nullptr && press_max_loss < 1;
  Session s(*pm.model, sp);
  if (p) {
    PressSchedule sched;
    sched.after_prefill = false;  // the context is compressed before the question
    s.set_press(std::move(p), sched);
  }
  QaOptions qo;
  qo.gen.max_new_tokens = max_tokens;
  qo.gen.sampling = {temperature, top_k, top_p, seed};
  qo.gen.stop_strings = stop;
  qo.compress.min_tokens = press_min_tokens;
  qo.compress.max_loss = press_max_loss;
  PyInterrupts py;
  qo.interrupted = [&] { return py.poll(); };
  qo.on_token = [&](size_t qi, int32_t, const std::string& piece) {
    if (py.poll()) return false;
    return layout.questions.size() > 1 ? py.call(on_token, piece, qi) : py.call(on_token, piece);
  };
  nb::list answers;
  qo.on_answer = [&](size_t qi, const QaAnswer& a, const QaRun& run) {
    nb::gil_scoped_acquire gil;
    answers.append(details ? nb::object(answer_dict(a, layout, qi, s, run.context_s))
                           : nb::object(nb::str(a.result.text.c_str())));
  };
  try {
    nb::gil_scoped_release nogil;
    answer_questions(s, layout, qo);
  } catch (const Error&) {
    if (!py.stopped()) throw;  // "interrupted" between the context's chunks: KeyboardInterrupt below
  }
  py.rethrow();
  const bool many = !nb::isinstance<nb::str>(question) && !question.is_none();
  if (many) return answers;
  return answers[0];
}

}  // namespace

void register_model(nb::module_& m) {
  nb::class_<PyModel>(m, "Model")
      .def(
          "__init__",
          [](PyModel* self, const std::string& name_or_path, int threads, int64_t n_ctx, const std::string& kv_type,
             std::optional<std::string> chat_template, bool f32_prefill) {
            KVTRIM_CHECK(threads >= 0, "threads must be >= 0 (got %d)", threads);
            KVTRIM_CHECK(n_ctx >= 0, "n_ctx must be >= 0 (got %lld)", static_cast<long long>(n_ctx));
            kv_dtype_from_name(kv_type);  // a bad name fails here
            set_int8_prefill(!f32_prefill);  // process-wide, as the command line's --f32-prefill
            new (self) PyModel();
            self->path = resolve_model_path(name_or_path);
            self->threads = threads;
            self->n_ctx = n_ctx;
            self->kv_type = kv_type;
            {
              nb::gil_scoped_release nogil;
              self->model = Model::load(self->path);
            }
            if (chat_template)
              self->model->set_chat_template(ChatTemplate::from_gguf(self->model->gguf(), *chat_template));
          },
          nb::arg("name_or_path"), nb::arg("threads") = 0, nb::arg("n_ctx") = 0, nb::arg("kv_type") = "f16",
          nb::arg("chat_template") = nb::none(), nb::arg("f32_prefill") = false)
      .def_ro("path", &PyModel::path)
      .def_rw("threads", &PyModel::threads)
      .def_prop_ro("name", [](const PyModel& m) { return m.model->hparams().name; })
      .def_prop_ro("arch", [](const PyModel& m) { return std::string(arch_name(m.model->hparams().arch)); })
      .def_prop_ro("n_layer", [](const PyModel& m) { return m.model->hparams().n_layer; })
      .def_prop_ro("n_head", [](const PyModel& m) { return m.model->hparams().n_head; })
      .def_prop_ro("n_head_kv", [](const PyModel& m) { return m.model->hparams().n_head_kv; })
      .def_prop_ro("head_dim", [](const PyModel& m) { return m.model->hparams().head_dim_k; })
      .def_prop_ro("n_ctx_train", [](const PyModel& m) { return m.model->hparams().n_ctx_train; })
      .def_prop_ro("n_vocab", [](const PyModel& m) { return m.model->tokenizer().n_vocab(); })
      .def_prop_ro("has_chat_template", [](const PyModel& m) { return m.model->chat_template().usable(); })
      .def(
          "tokenize",
          [](const PyModel& m, const std::string& text, bool add_bos, bool special) {
            return m.model->tokenizer().encode(text, add_bos && m.model->tokenizer().add_bos(), special);
          },
          nb::arg("text"), nb::arg("add_bos") = true, nb::arg("special") = false)
      .def(
          "detokenize",
          [](const PyModel& m, const std::vector<int32_t>& ids) {
            const int32_t nv = m.model->tokenizer().n_vocab();
            for (int32_t id : ids) KVTRIM_CHECK(id >= 0 && id < nv, "token id %d out of range [0, %d)", id, nv);
            return m.model->tokenizer().decode(ids);
          },
          nb::arg("ids"))
      .def(
          "apply_chat_template",
          [](const PyModel& m, nb::handle messages, bool add_generation_prompt) {
            return m.model->chat_template().render(messages_from(messages), add_generation_prompt);
          },
          nb::arg("messages"), nb::arg("add_generation_prompt") = true)
      .def("generate", &generate, nb::arg("prompt") = nb::none(), nb::kw_only(), nb::arg("context") = nb::none(),
           nb::arg("question") = nb::none(), nb::arg("press") = nb::none(), nb::arg("max_tokens") = 128,
           nb::arg("temperature") = 0.f, nb::arg("top_k") = 40, nb::arg("top_p") = 0.95f, nb::arg("seed") = 42,
           nb::arg("chat") = false, nb::arg("system") = nb::none(), nb::arg("protect") = 0,
           nb::arg("press_min_tokens") = 32, nb::arg("press_max_loss") = 1.0, nb::arg("stop") = std::vector<std::string>{},
           nb::arg("n_ctx") = nb::none(), nb::arg("on_token") = nb::none(), nb::arg("details") = false);
  m.def("known_models", &known_model_names, "Installed model names (resolved as Model(name)).");
}

}  // namespace kvtrim::py
