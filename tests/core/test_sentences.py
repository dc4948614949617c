"""Sentence splitting for BERT's documents: Latin scripts as before, Chinese and Japanese at 。！？ and ellipses."""

from __future__ import annotations

import pytest

from transformer_cli.core.sentences import heading_level, split_sentences


def test_latin_splitting_is_unchanged():
    text = 'Dr. Smith arrived at 5 p.m. yesterday. He met J. Doe! Was it fun? "Yes." It was 3.5 km away.'
    assert split_sentences(text) == [
        "Dr. Smith arrived at 5 p.m. yesterday.",
        "He met J. Doe!",
        "Was it fun?",
        '"Yes."',
        "It was 3.5 km away.",
    ]
    assert split_sentences("the end. and lower case goes on. Next one.") == [
        "the end. and lower case goes on.",
        "Next one.",
    ]


def test_chinese_news_paragraph():
    text = (
        "新华社北京3月5日电（记者王晓）国务院总理今天在人民大会堂作政府工作报告。报告指出，2024年国内生产总值增长"
        "5.2%！“我们有信心、有能力实现全年目标。”他说。这意味着什么？专家认为，前景依然光明……但挑战也不少。"
    )
    assert split_sentences(text) == [
        "新华社北京3月5日电（记者王晓）国务院总理今天在人民大会堂作政府工作报告。",
        "报告指出，2024年国内生产总值增长5.2%！",  # the decimal point of 5.2 is no end
        "“我们有信心、有能力实现全年目标。”",  # the closing quote stays with its sentence
        "他说。",
        "这意味着什么？",
        "专家认为，前景依然光明……",
        "但挑战也不少。",
    ]
    assert "".join(split_sentences(text)) == text  # nothing lost, nothing added


def test_chinese_runs_quotes_and_brackets():
    text = "“你真的要走吗？！”她问。“不去……”他回答。（完）《人民日报》报道：“会议圆满结束！”记者获悉。"
    assert split_sentences(text) == [
        "“你真的要走吗？！”",
        "她问。",
        "“不去……”",
        "他回答。",
        "（完）《人民日报》报道：“会议圆满结束！”",
        "记者获悉。",
    ]
    # a comma after the closing quote continues the sentence
    assert split_sentences("“太好了！”，他笑着说。大家都鼓掌。") == ["“太好了！”，他笑着说。", "大家都鼓掌。"]
    assert split_sentences("真的吗？？？是的！！") == ["真的吗？？？", "是的！！"]


def test_japanese():
    text = "「ありがとう。」と彼は言った。今日はいい天気ですね！明日も晴れるでしょうか？東京タワーは333メートルです。"
    assert split_sentences(text) == [
        "「ありがとう。」と彼は言った。",  # 」と: the quote is part of the sentence
        "今日はいい天気ですね！",
        "明日も晴れるでしょうか？",
        "東京タワーは333メートルです。",
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "Apple发布了新款iPhone 16。售价为799美元! 消费者反应热烈。",
            ["Apple发布了新款iPhone 16。", "售价为799美元!", "消费者反应热烈。"],
        ),
        ("He said hello. 然后他走了。Then he left.", ["He said hello.", "然后他走了。", "Then he left."]),
        ("会议由Dr. Smith主持。", ["会议由Dr. Smith主持。"]),  # an abbreviation after CJK text is still one
        ("版本v1.2.3已发布。下载地址见官网.", ["版本v1.2.3已发布。", "下载地址见官网."]),
    ],
)
def test_mixed_text(text, expected):
    assert split_sentences(text) == expected


def test_six_dots_end_a_sentence_only_after_chinese():
    assert split_sentences("他想了想......没有说话。") == ["他想了想......", "没有说话。"]
    assert split_sentences("Wait...... what? Fine.") == ["Wait...... what?", "Fine."]


def test_spaces_between_chinese_sentences_are_dropped():
    assert split_sentences("第一句。 第二句！  第三句") == ["第一句。", "第二句！", "第三句"]


def test_heading_level():
    assert heading_level(" = Alpha = ") == 1
    assert heading_level("= = Section = =") == 2
    assert heading_level("= =") == 0
    assert heading_level("A = B =") == 0
