// Teacher-forced logits from llama.cpp (libllama), for reference data. Build against a llama.cpp build:
//   g++ -O2 -std=c++17 scripts/llama_teacher_forced.cpp -I$LCP/include -I$LCP/ggml/include -L$LCP/build/bin -lllama -lggml -lggml-base -o tf
// scripts/reference_decode.py builds and runs it. Written for Kinetic; no llama.cpp code is copied.
// teacher-forced logits + optional tensor dumps from llama.cpp (scratch tool)
// usage: tf MODEL IDSFILE NPROMPT OUTLOGITS [DUMPDIR DUMPSTEP]
// IDSFILE: whitespace separated token ids; first NPROMPT are the prompt (one batch), the rest fed one at a time.
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <fstream>

static std::string g_dumpdir; static int g_step = -1; static int g_cur = -2;

static bool cb(struct ggml_tensor * t, bool ask, void *) {
    if (ask) return g_cur == g_step;
    if (g_cur != g_step) return true;
    if (t->type != GGML_TYPE_F32) return true;
    std::vector<float> buf(ggml_nelements(t));
    if (!ggml_is_contiguous(t)) return true;
    ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
    std::string fn = g_dumpdir + "/" + t->name + ".f32";
    for (int k = 1; ; k++) { FILE * e = fopen(fn.c_str(), "rb"); if (!e) break; fclose(e); fn = g_dumpdir + "/" + t->name + "#" + std::to_string(k) + ".f32"; }
    FILE * f = fopen(fn.c_str(), "wb");
    int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
    fwrite(ne, sizeof(ne), 1, f);
    fwrite(buf.data(), 4, buf.size(), f);
    fclose(f);
    return true;
}

int main(int argc, char ** argv) {
    const char * model_path = argv[1];
    std::vector<llama_token> ids; { std::ifstream in(argv[2]); int x; while (in >> x) ids.push_back(x); }
    int np = atoi(argv[3]);
    const char * out = argv[4];
    if (argc > 6) { g_dumpdir = argv[5]; g_step = atoi(argv[6]); }
    llama_backend_init();
    auto mp = llama_model_default_params(); mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    auto cp = llama_context_default_params();
    cp.n_ctx = 4096; cp.n_batch = 2048; cp.n_ubatch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO; cp.n_seq_max = 1;
    if (getenv("TF_NO_FA")) cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = cb; cp.cb_eval_user_data = nullptr;
    llama_context * ctx = llama_init_from_model(model, cp);
    const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * fo = fopen(out, "wb");
    // prompt
    g_cur = 0;
    llama_batch b = llama_batch_init(2048, 0, 1);
    int split = getenv("TF_SPLIT") ? atoi(getenv("TF_SPLIT")) : 0;  // last `split` prompt tokens in a second batch
    int starts[2] = {0, np - split};
    for (int part = 0; part < 2; part++) {
        int s0 = starts[part], s1 = part == 0 ? np - split : np;
        if (s1 <= s0) continue;
        b.n_tokens = s1 - s0;
        for (int i = s0; i < s1; i++) { int j = i - s0; b.token[j] = ids[i]; b.pos[j] = i; b.n_seq_id[j] = 1; b.seq_id[j][0] = 0; b.logits[j] = (i == np - 1); }
        if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
    }
    fwrite(llama_get_logits_ith(ctx, -1), 4, nv, fo);
    for (size_t i = np; i < ids.size(); i++) {
        g_cur = (int)(i - np + 1);
        b.n_tokens = 1; b.token[0] = ids[i]; b.pos[0] = i; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1;
        if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
        fwrite(llama_get_logits_ith(ctx, -1), 4, nv, fo);
    }
    fclose(fo);
    llama_batch_free(b);
    llama_free(ctx); llama_model_free(model);
    return 0;
}
